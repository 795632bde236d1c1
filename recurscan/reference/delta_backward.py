"""The backward pass of Gated DeltaNet's chunkwise algorithm, written out: the page a backward
kernel is checked against, and checked itself against autograd through the token loop.

The forward of one window (:func:`~recurscan.reference.delta.gdn_chunk`), per value head, from the
state S entering it (Gam, lam, gam the window's decays; beta per head)::

    A      = strict_lower(K K^T) o Gam
    U      = (I + diag(beta) A)^-1 diag(beta) (V - diag(lam) K S)        the window's writes
    O      = scale (diag(lam) Q S + lower(Q K^T o Gam) U)
    S_next = lam_C S + K^T diag(gam) U

The backward of a window takes dO and dS_next and returns dS (the gradient of the state entering
it) and the window's input gradients; a sequence's backward is the reverse scan of dS over its
windows, each window recomputed from its boundary state (the states entering the windows, a
forward pass stores them: ``return_chunk_states``), never from one state a token.
"""
from __future__ import annotations

import torch

from ..algebra import segsum
from .common import CHUNK_SIZE, compute_dtype, l2norm, sequence_blocks, windows
from .delta import _prepare, expand_householder, gdn_chunk


def gdn_chunk_backward(S, q, k, v, g, beta, scale, dO, dS_next):
    """The backward of one window of :func:`~recurscan.reference.delta.gdn_chunk`.

    Shapes as gdn_chunk's (N sequences, H value heads, C tokens; beta per head [N, H, C]), plus
    dO [N, H, C, V] and dS_next [N, H, K, V]. Returns (dS, dq, dk, dv, dg, dbeta) shaped as
    (S, q, k, v, g, beta). A beta per value column is one such window per column (the columns of
    the state never meet): :func:`gdn_chunk_backward_per_column`.
    """
    C = q.shape[2]
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
    T = lambda x: x.transpose(-1, -2)  # noqa: E731

    # 1. Recompute the window's forward from S (gdn_chunk's steps 1-3).
    Gam = torch.where(lower, segsum(g).exp(), 0)  # [N, H, C, C]
    lam = torch.cumsum(g, dim=-1).exp()  # [N, H, C]
    gam = Gam[..., -1, :]
    KK = k @ T(k)
    A = torch.where(strict, KK * Gam, 0)
    KS = k @ S  # [N, H, C, V]
    rhs = v - lam.unsqueeze(-1) * KS
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    system = torch.where(strict, beta.unsqueeze(-1) * A, eye)  # I + diag(beta) A
    U = torch.linalg.solve_triangular(system, beta.unsqueeze(-1) * rhs, upper=False, unitriangular=True)
    QK = q @ T(k)
    scores = torch.where(lower, QK * Gam, 0)

    # 2. Through the outputs and the state leaving the window: O = scale (diag(lam) Q S + scores U),
    #    S_next = lam_C S + K^T diag(gam) U.
    KdS = k @ dS_next  # [N, H, C, V]
    dU = scale * T(scores) @ dO + gam.unsqueeze(-1) * KdS
    dS = scale * T(q) @ (lam.unsqueeze(-1) * dO) + lam[..., -1, None, None] * dS_next
    dscores = torch.where(lower, scale * dO @ T(U), 0)
    dq = (dscores * Gam) @ k + scale * lam.unsqueeze(-1) * (dO @ T(S))
    dk = T(dscores * Gam) @ q + gam.unsqueeze(-1) * (U @ T(dS_next))
    dGam = dscores * QK
    dlam = scale * (dO * (q @ S)).sum(-1)
    dlam[..., -1] += (S * dS_next).sum((-1, -2))
    dGam[..., -1, :] += (KdS * U).sum(-1)  # gam = Gam[C - 1, :]

    # 3. Through the triangular solve U = system^-1 Y, Y = diag(beta) rhs: dY = system^-T dU and
    #    d(system) = -dY U^T on its strictly lower part, system = I + diag(beta) A.
    dY = torch.linalg.solve_triangular(T(system), dU, upper=True, unitriangular=True)
    dsys = torch.where(strict, -dY @ T(U), 0)
    dbeta = (dsys * A).sum(-1) + (dY * rhs).sum(-1)
    dA = beta.unsqueeze(-1) * dsys
    dk = dk + (dA * Gam) @ k + T(dA * Gam) @ k
    dGam = dGam + dA * KK

    # 4. Through rhs = V - diag(lam) K S.
    drhs = beta.unsqueeze(-1) * dY
    dv = drhs
    dlam = dlam - (drhs * KS).sum(-1)
    dk = dk - lam.unsqueeze(-1) * (drhs @ T(S))
    dS = dS - T(k) @ (lam.unsqueeze(-1) * drhs)

    # 5. The decays. Gam[i, j] = exp(g_{j+1} + ... + g_i) and lam_i = exp(g_1 + ... + g_i), so
    #    dg_m = sum_{i >= m} dlam_i lam_i + sum_{i >= m > j} dGam[i, j] Gam[i, j]: sums of products
    #    that hold g_m (no difference of cumulative sums, so a reset's gradient is exactly 0).
    dSeg = torch.where(lower, dGam * Gam, 0)
    below = torch.flip(torch.cumsum(torch.flip(dSeg, [-2]), -2), [-2])  # [i >= m] summed: row m
    dg = torch.where(strict, below, 0).sum(-1)  # then j < m
    dg = dg + torch.flip(torch.cumsum(torch.flip(dlam * lam, [-1]), -1), [-1])
    return dS, dq, dk, dv, dg, dbeta


def gdn_chunk_backward_per_column(S, q, k, v, g, beta, scale, dO, dS_next):
    """:func:`gdn_chunk_backward` with beta [N, H, C, V] (a beta per value column): each column is
    a window of its own with V = 1; q, k and g gradients are summed over the columns."""
    grads = [gdn_chunk_backward(S[..., c:c + 1], q, k, v[..., c:c + 1], g, beta[..., c], scale, dO[..., c:c + 1],
                                dS_next[..., c:c + 1]) for c in range(v.shape[-1])]
    dS, dq, dk, dv, dg, dbeta = zip(*grads)
    return (torch.cat(dS, -1), sum(dq), sum(dk), torch.cat(dv, -1), sum(dg), torch.stack(dbeta, -1))


def gated_delta_rule_chunked_backward(q, k, v, g, beta, do, dht=None, scale=None, initial_state=None,
                                      use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=CHUNK_SIZE):
    """Gradients of :func:`~recurscan.reference.delta.gated_delta_rule_chunked`'s ``(o, final_state)``.

    Arguments as the forward, plus ``do [B, T, HV, V]`` and ``dht [N, HV, K, V]`` (None: zeros).
    Returns ``(dq, dk, dv, dg, dbeta, dh0)`` shaped as the inputs, in the compute dtype; None where
    the input was None. With GVA the q/k gradients are summed over each group's value heads.

    Per sequence: 1. a forward pass keeps the state entering every window; 2. the reverse scan
    carries dS from the last window to the first, each window's gradients from
    :func:`gdn_chunk_backward`; 3. dS entering the first window is dh0; 4. GVA sums and the L2 norm's
    backward give dq and dk.

    Example:
        >>> import torch
        >>> from recurscan.reference.delta import gated_delta_rule_naive
        >>> from recurscan.reference.delta_backward import gated_delta_rule_chunked_backward
        >>> x = [torch.randn(1, 70, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3)]
        >>> g = (-torch.rand(1, 70, 2, dtype=torch.float64)).requires_grad_()
        >>> beta = torch.rand(1, 70, 2, dtype=torch.float64, requires_grad=True)
        >>> o, S = gated_delta_rule_naive(*x, g, beta)
        >>> do = torch.randn_like(o)
        >>> want = torch.autograd.grad(o, [*x, g, beta], do)
        >>> got = gated_delta_rule_chunked_backward(*x, g, beta, do)[:5]
        >>> all(torch.allclose(a, b) for a, b in zip(got, want))
        True
    """
    q_in, k_in = q, k
    q, k, v, g_, beta_, scale, S0, segs, dtype = _prepare(q, k, v, g, beta, scale, initial_state,
                                                          use_qk_l2norm_in_kernel, cu_seqlens)
    B, T, HV, V = v.shape
    per_column = beta_.dim() == 4
    backward = gdn_chunk_backward_per_column if per_column else gdn_chunk_backward
    do = do.to(dtype)
    grads = [torch.zeros_like(x) for x in (q, k, v, g_, beta_)]  # on the value heads
    dh0 = torch.zeros_like(S0)
    for block in sequence_blocks(B, T, cu_seqlens):
        sl = (block.rows, slice(block.start, block.end))
        xs = [x[sl].transpose(1, 2) for x in (q, k, v, g_, beta_, do)]  # [N, H, L, .]
        gs = [x[sl].transpose(1, 2) for x in grads]
        S = S0[block.seqs]
        entering = []
        for a, b in windows(block.end - block.start, chunk_size):  # 1. the boundary states
            entering.append(S)
            _, S = gdn_chunk(S, *(x[:, :, a:b] for x in xs[:5]), scale)
        dS = torch.zeros_like(S) if dht is None else dht[block.seqs].to(dtype)
        for (a, b), S in reversed(list(zip(windows(block.end - block.start, chunk_size), entering))):  # 2.
            dS, *d = backward(S, *(x[:, :, a:b] for x in xs[:5]), scale, xs[5][:, :, a:b], dS)
            for acc, dx in zip(gs, d):
                acc[:, :, a:b] = dx
        dh0[block.seqs] = dS  # 3.
    dq, dk, dv, dg, dbeta = grads
    # 4. GVA: value head hv read q/k head hv // (HV / H); then the L2 norm's backward,
    #    y = x r with r = (|x|^2 + eps)^-1/2: dx = r (dy - y (y . dy)).
    H = q_in.shape[2]
    dq, dk = (d.reshape(B, T, H, HV // H, -1).sum(3) for d in (dq, dk))
    if use_qk_l2norm_in_kernel:
        dq, dk = (_l2norm_backward(x.to(dtype), d) for x, d in ((q_in, dq), (k_in, dk)))
    return (dq, dk, dv, dg if g is not None else None, dbeta if beta is not None else None,
            dh0 if initial_state is not None else None)


def gated_delta_product_chunked_backward(q, k, v, g, beta, num_householder, do, dht=None, scale=None,
                                         initial_state=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                                         chunk_size=CHUNK_SIZE):
    """Gradients of :func:`~recurscan.reference.delta.gated_delta_product_chunked`'s ``(o, final_state)``.

    The chunked GDP is GDN on the expanded stream (q on each token's last copy, g on its first), so
    its backward is GDN's there: dq is read back from the last copies, dg from the first. Shapes as
    the forward (q, g, do on the token stream; k, v, beta on the expanded one). Returns
    ``(dq, dk, dv, dg, dbeta, dh0)``, None where the input was None.
    """
    M = num_householder
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    q_in, k_in = q.to(dtype), k.to(dtype)
    qn, kn = (l2norm(q_in), l2norm(k_in)) if use_qk_l2norm_in_kernel else (q_in, k_in)
    q_exp, g_exp = expand_householder(qn, g, M)
    do_exp = do.new_zeros(do.shape[0], do.shape[1] * M, *do.shape[2:]).to(dtype)
    do_exp[:, M - 1::M] = do
    dq, dk, dv, dg, dbeta, dh0 = gated_delta_rule_chunked_backward(
        q_exp, kn, v, g_exp, beta, do_exp, dht, scale=q.shape[-1] ** -0.5 if scale is None else scale,
        initial_state=initial_state, cu_seqlens=None if cu_seqlens is None else cu_seqlens * M,
        chunk_size=chunk_size)
    dq, dg = dq[:, M - 1::M], None if g is None else dg[:, ::M]
    if use_qk_l2norm_in_kernel:
        dq, dk = _l2norm_backward(q_in, dq), _l2norm_backward(k_in, dk)
    return dq, dk, dv, dg, dbeta, dh0


def _l2norm_backward(x, dy, eps: float = 1e-6):
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
    y = x * r
    return r * (dy - y * (y * dy).sum(-1, keepdim=True))


__all__ = ["gdn_chunk_backward", "gdn_chunk_backward_per_column", "gated_delta_rule_chunked_backward",
           "gated_delta_product_chunked_backward"]
