"""Public decode ops of the delta-rule family: the token-by-token (recurrent) form against a state
cache, with speculative-decoding snapshots (seed 002). They share the validation and cache
handling of :mod:`recurscan.ops.delta_rule`."""
from __future__ import annotations

import torch

from .delta_rule import _run_delta


def fused_recurrent_gated_delta_rule_update(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                            output_final_state=False, use_qk_l2norm_in_kernel=False,
                                            cu_seqlens=None, state=None, state_indices=None,
                                            intermediate_states=None, steps_per_token=1):
    """Recurrent Gated DeltaNet (decode and speculative decoding), seed 002's signature.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV]`` or None;
        beta: ``[B, T, HV]`` or ``[B, T, HV, V]`` or None (ones); scale: default ``K ** -0.5``.
        initial_state / output_final_state / cu_seqlens / state / state_indices: as
            :func:`chunk_gated_delta_rule`.
        intermediate_states: ``[S, T // steps_per_token, HV, K, V]`` snapshot buffer, written at the
            cache slots: entry ``[slot, i]`` is the state after draft token i (after its
            ``steps_per_token`` steps). Padding requests write nothing. Needs ``state``.
        steps_per_token: recurrence steps per draft token (M when GDP is folded into the sequence).

    Returns:
        ``(o [B, T, HV, V], final_state)``; with ``state`` the final state is the cache itself.

    Example:
        >>> import torch, recurscan
        >>> cache = torch.zeros(8, 4, 16, 16)
        >>> q, k, v = torch.randn(3, 1, 2, 16), torch.randn(3, 1, 2, 16), torch.randn(3, 1, 4, 16)
        >>> g, beta = -torch.rand(3, 1, 4), torch.rand(3, 1, 4)
        >>> o, _ = recurscan.fused_recurrent_gated_delta_rule_update(
        ...     q, k, v, g, beta, state=cache, state_indices=torch.tensor([5, -1, 2]))
        >>> bool(o[1].eq(0).all()), bool(cache[0].eq(0).all())
        (True, True)
    """
    if intermediate_states is None:
        return _run_delta(q, k, v, g, beta, num_householder=1, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                          state=state, state_indices=state_indices, return_chunk_states=False,
                          algorithm="recurrent")
    if isinstance(steps_per_token, bool) or not isinstance(steps_per_token, int) or steps_per_token < 1:
        raise ValueError(f"steps_per_token: expected an int >= 1, got {steps_per_token!r}")
    if state is None:
        raise ValueError("intermediate_states: snapshots are written at cache slots; pass state and state_indices")
    if not isinstance(intermediate_states, torch.Tensor) or intermediate_states.dim() != 5 \
            or intermediate_states.shape[0] != state.shape[0] or intermediate_states.shape[2:] != state.shape[1:]:
        raise ValueError(f"intermediate_states: expected shape [S, T // steps_per_token, HV, K, V] with "
                         f"[S, HV, K, V] = {list(state.shape)}, got "
                         f"{list(intermediate_states.shape) if isinstance(intermediate_states, torch.Tensor) else intermediate_states}")
    # Snapshots are the states entering each "chunk" of steps_per_token steps, shifted by one.
    o, final, snaps = _run_delta(q, k, v, g, beta, num_householder=1, scale=scale, initial_state=None,
                                 output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                 cu_seqlens=cu_seqlens, state=state, state_indices=state_indices,
                                 return_chunk_states=True, algorithm="recurrent", chunk_size=steps_per_token)
    _write_snapshots(intermediate_states, snaps, state, state_indices, q.shape[0], q.shape[1], cu_seqlens,
                     steps_per_token)
    return o, final


def _write_snapshots(buffer, entering, state, state_indices, batch, length, cu_seqlens, steps):
    """Store, for each live sequence, the state after each of its complete draft tokens."""
    if cu_seqlens is None:
        lengths = [length] * batch
    else:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    row = 0
    for n, L in enumerate(lengths):
        chunks = -(-L // steps)
        slot = int(state_indices[n])
        if slot >= 0:
            after = list(entering[row + 1 : row + chunks]) + [state[slot].to(entering.dtype)]
            for i in range(L // steps):  # only complete draft tokens have a snapshot
                buffer[slot, i] = after[i].to(buffer.dtype)
        row += chunks


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False):
    """fla's ``fused_recurrent_gated_delta_rule`` signature and returns: switch by changing an import.

    Shapes and semantics as :func:`fused_recurrent_gated_delta_rule_update`; returns
    ``(o, final_state or None)``.
    """
    return fused_recurrent_gated_delta_rule_update(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
