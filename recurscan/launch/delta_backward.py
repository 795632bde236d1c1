"""The launches of the chunked delta rule's backward, kernels/delta/backward.py (GDN; GDP as GDN on
its expanded stream, :func:`chunk_delta_product_bwd`):

1. the forward again, for the states entering every chunk (its chunk states);
2. the forward's prep with STORE_INV, for ``G o Tinv``, ``aqk`` and ``coef``;
3. the reverse sweep (dS carried last chunk to first; dv, U, dY, dS per chunk, dh0);
4. the parallel stage (dq, dk per value head, dg, dbeta), one program per chunk and value head;
5. the GVA sum of dq and dk over each group's value heads.

Saved from the forward: nothing but the inputs; every scratch here lives for the call.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..descriptors import CHUNK_SIZE
from ..kernels.delta.backward import chunk_delta_bwd_grads_kernel, chunk_delta_bwd_sweep_kernel
from ..kernels.delta.prep import chunk_delta_prep_kernel
from ..plan.delta import DELTA_BACKWARD_LAUNCH, DeltaBackwardShape, DeltaShape
from ..reference.delta import expand_householder
from .delta import INTERPRET, TEST_SHAPE, DeltaInputs, build_delta_launches, run_delta_launches


def chunk_delta_bwd(q, k, v, g, beta, do, dht=None, *, scale=None, initial_state=None,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                    shape: DeltaShape | None = None, backward_shape: DeltaBackwardShape = DELTA_BACKWARD_LAUNCH):
    """Gradients ``(dq, dk, dv, dg, dbeta, dh0)`` of ``chunk_delta_fwd``'s ``(o, final_state)``
    for GDN (M = 1), given ``do [B, T, HV, V]`` and ``dht [N, HV, K, V]`` (None: zeros). Shapes and
    the varlen descriptors as the forward's (``chunk_indices`` and ``chunk_offsets`` required with
    ``cu_seqlens``); ``shape`` is the forward's launch shape, ``backward_shape`` the stages'.
    All float32; None where the input was None (g, beta, initial_state)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = CHUNK_SIZE
    scale = K ** -0.5 if scale is None else float(scale)
    varlen = cu_seqlens is not None
    N = cu_seqlens.shape[0] - 1 if varlen else B
    shape = dataclasses.replace(shape or TEST_SHAPE, segments=1, phases=1)
    rows = chunk_indices.shape[0] if varlen else B * triton.cdiv(T, BT)
    inputs = DeltaInputs(q, k, v, g, beta, initial_state, None, None, cu_seqlens, chunk_indices, chunk_offsets)
    common = dict(initial_state=initial_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale,
                  cu_seqlens=cu_seqlens, chunk_indices_dp=chunk_indices, chunk_offsets=chunk_offsets)
    # 1. The states entering every chunk, in the inputs' dtype: the sweep's product operand.
    forward = build_delta_launches(q, k, v, g, beta, shape, return_chunk_states=True, num_chunk_rows=rows,
                                   chunk_states_dtype=q.dtype, **common)
    states = run_delta_launches(forward, inputs)[2]
    # 2. The prep again, storing G o Tinv in place of wy.
    prep = build_delta_launches(q, k, v, g, beta, shape, **common)
    steps = [dataclasses.replace(s, kwargs=dict(s.kwargs, STORE_INV=True), direct=None)
             for s in prep.steps if s.kernel is chunk_delta_prep_kernel]
    written = ("wy", "aqk", "coef", "sequence_order", "beta_ones")  # what the prep reads or writes
    prep = dataclasses.replace(prep, buffers={n: b for n, b in prep.buffers.items() if n in written}, steps=steps,
                               outputs=("wy", "aqk", "coef"), launched=False)
    winv, aqk, coef = run_delta_launches(prep, inputs)
    beta_t = beta if beta is not None else torch.ones(B, T, HV, dtype=q.dtype, device=q.device)
    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    # Product operands in the inputs' dtype (the interpreter multiplies bf16 tiles wrongly: float32 there).
    dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[q.dtype]
    dt = tl.float32 if INTERPRET and dt == tl.bfloat16 else dt
    f32 = dict(dtype=torch.float32, device=q.device)
    # 3. The reverse sweep. U, dY and dS per chunk are kept in the inputs' dtype: the parallel
    #    stage takes them as product operands.
    BK = max(16, triton.next_power_of_2(K))
    BV = min(backward_shape.block_v, max(16, triton.next_power_of_2(V)))
    dstates = torch.empty_like(states)
    dh0 = torch.empty(N, HV, K, V, **f32) if initial_state is not None else None
    u, dy = (torch.empty(B, T, HV, V, dtype=q.dtype, device=q.device) for _ in range(2))
    dv = torch.empty(B, T, HV, V, **f32)
    # The stages index these as dense [B, T, heads, dim] (and dht as [N, HV, K, V]): any strided input is copied.
    qc, kc, vc, doc, beta_t = (x.contiguous() for x in (q, k, v, do, beta_t))
    g = None if g is None else g.contiguous()
    dht = None if dht is None else dht.float().contiguous()
    chunk_delta_bwd_sweep_kernel[(N * HV * triton.cdiv(V, BV),)](
        qc, kc, vc, beta_t, doc, winv, aqk, coef, states, dstates, dht if dht is not None else dv,
        dh0 if dh0 is not None else dv, u, dy, dv,
        cu_seqlens if varlen else dv, chunk_offsets if varlen else dv, T, states.shape[0],
        H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen, HAS_DHT=dht is not None,
        STORE_DH0=dh0 is not None, DOT_PRECISION=dot_precision, DT=dt, num_warps=backward_shape.sweep_warps)
    # 4. The parallel stage (zeros where a padding chunk writes none).
    dq, dk = (torch.zeros(B, T, HV, K, **f32) for _ in range(2))
    dg = torch.zeros(B, T, HV, **f32) if g is not None else None
    dbeta = torch.zeros(B, T, HV, **f32)
    chunks = chunk_indices.shape[0] if varlen else B * triton.cdiv(T, BT)
    scratch = torch.empty(chunks * HV, 2, BT, BT, dtype=q.dtype, device=q.device)
    chunk_delta_bwd_grads_kernel[(chunks * HV,)](
        qc, kc, vc, g if g is not None else dbeta, beta_t, doc, u, dy, states, dstates, dq, dk,
        dg if dg is not None else dbeta, dbeta, scratch, cu_seqlens if varlen else dv,
        chunk_indices if varlen else dv, chunk_offsets if varlen else dv, T, N, scale, states.shape[0],
        H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen,
        HAS_G=g is not None, USE_L2NORM=use_qk_l2norm_in_kernel, DOT_PRECISION=dot_precision, DT=dt,
        num_warps=backward_shape.grads_warps)
    # 5. GVA: value head hv read q/k head hv // (HV / H).
    if HV != H:
        dq, dk = (d.view(B, T, H, HV // H, K).sum(3) for d in (dq, dk))
    return dq, dk, dv, dg, dbeta if beta is not None else None, dh0


def chunk_delta_product_bwd(q, k, v, g, beta, num_householder, do, dht=None, *, scale=None, initial_state=None,
                            use_qk_l2norm_in_kernel=False, cu_seqlens=None, shape: DeltaShape | None = None,
                            backward_shape: DeltaBackwardShape = DELTA_BACKWARD_LAUNCH):
    """Gated Delta Product's gradients: GDN's backward on the expanded stream, where q sits on each
    token's last copy and g on its first (zeros elsewhere; a zero row of q stays zero under the
    L2 norm, and its gradient is not read), then dq read back from the last copies and dg from the
    first. Shapes as ``chunk_gated_delta_product_varlen``'s; builds the expanded stream's
    descriptors on the host (one sync)."""
    from ..descriptors import build_chunk_descriptors
    M = num_householder
    q_exp, g_exp = expand_householder(q, g, M)
    do_exp = expand_householder(do, None, M)[0]  # the output is read on the last copy, as q
    desc = {}
    cu_exp = None
    if cu_seqlens is not None:
        cu_exp = cu_seqlens * M
        built = build_chunk_descriptors(cu_exp, device=q.device)
        desc = dict(chunk_indices=built.chunk_indices, chunk_offsets=built.chunk_offsets)
    dq, dk, dv, dg, dbeta, dh0 = chunk_delta_bwd(
        q_exp, k, v, g_exp, beta, do_exp, dht, scale=q.shape[-1] ** -0.5 if scale is None else scale,
        initial_state=initial_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_exp,
        shape=shape, backward_shape=backward_shape, **desc)
    return dq[:, M - 1::M], dk, dv, None if dg is None else dg[:, ::M], dbeta, dh0
