"""The scalar-decay GLA forward parallel over the sequence (kernels/gla/segments.py), as three
steps in PyTorch: the readable form of the kernels, dense batches. Each segment of ``segment``
tokens is a window of the chunkwise algorithm (``reference.gla.gla_chunk``) run from a zero state;
a chain over the segments then carries the state, and each output adds what the state entering
its segment contributes."""
from __future__ import annotations

import torch

from recurscan.reference.common import compute_dtype, repeat_heads
from recurscan.reference.gla import gla_chunk


def gla_segmented(q, k, v, g, scale, initial_state=None, segment=256):
    """``(o [B, T, HV, V], final state [B, HV, K, V])`` of ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``,
    ``o_t = scale S_t^T q_t`` (q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, g ``[B, T, HV]``), in
    float64 for float64 inputs, else float32.

    Example:
        >>> import torch
        >>> from recurscan.reference.gla_segments import gla_segmented
        >>> q, k, v = torch.randn(1, 300, 2, 8), torch.randn(1, 300, 2, 8), torch.randn(1, 300, 2, 4)
        >>> o, S = gla_segmented(q, k, v, -torch.rand(1, 300, 2), 0.5, segment=128)
        >>> o.shape, S.shape
        (torch.Size([1, 300, 2, 4]), torch.Size([1, 2, 8, 4]))
    """
    dtype = compute_dtype(q, k, v, g)
    B, T, HV, V = v.shape
    q, k = (repeat_heads(x.to(dtype), HV, 2) for x in (q, k))
    v, g = v.to(dtype), g.to(dtype)
    K, NS = q.shape[-1], -(-T // segment)
    pad = NS * segment - T  # zero keys and values, log decay 0: nothing added, nothing decayed
    seg = lambda x: torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)).reshape(  # noqa: E731
        B * NS, segment, *x.shape[2:])
    qs, ks, vs, gs = seg(q * scale), seg(k), seg(v), seg(g[..., None])

    # 1. Each segment from a zero state, all at once: its outputs, and the state it adds (dS).
    o_local, added = gla_chunk(qs, ks, vs, gs, q.new_zeros(B * NS, HV, K, V))
    added = added.reshape(B, NS, HV, K, V)
    whole = gs[..., 0].sum(1).exp().reshape(B, NS, HV)  # each segment's decay (a reset: 0)

    # 2. The chain over segments: the state entering each one.
    S = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.to(dtype)
    entering = []
    for s in range(NS):
        entering.append(S)
        S = whole[:, s, :, None, None] * S + added[:, s]
    entering = torch.stack(entering, 1).reshape(B * NS, HV, K, V)

    # 3. Each output adds the entering state's part, decayed from the segment's start through it.
    from_start = gs[..., 0].cumsum(1).exp()  # [B * NS, L, HV]
    o = o_local + torch.einsum("nlhk,nhkv->nlhv", qs * from_start[..., None], entering)
    return o.reshape(B, NS * segment, HV, V)[:, :T], S
