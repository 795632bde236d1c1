"""The launches of the fused prefill (``DeltaShape.fused``; kernels/gluon/delta_fused.py), built for
launch/delta.py's ``build_delta_launches``: the chunk vectors' pass, the fused kernel, and the
token loop over the value columns the fused kernel flagged. No decisions here: the
planner chose the shape, and ``fused_call_ok`` says whether this call's tensors can take it.

    1. chunk_vectors_kernel     (chunks x H)   each chunk's gc, beta, rk, rq; NaN gc for a chunk
                                               the fused kernel must not compute
    2. gluon_fused_prefill      (N x HV)       o, the final state (or the cache slot's), a flag
                                               a value column of the state
    3. streaming_recurrence     (N x HV x V/BV, FLAGGED)  the flagged columns again, token by
                                               token (the others' programs exit at once)

The third step's outputs are the token loop's, within the oracle's tolerance of the chunked ones;
under non-finite input they are the reference's (outputs before a bad token finite).
"""
from __future__ import annotations

import torch
import triton

from ..descriptors import CHUNK_SIZE
from ..kernels.delta.chunk_vectors import VECTOR_ROWS, chunk_vectors_grid, chunk_vectors_kernel
from ..kernels.stream.recurrence import streaming_recurrence_kernel
from ..plan import delta as plan_delta
from ..plan.stream import StreamSizes, stream_shape
from ..runtime.launcher import CallArg


def fused_call_ok(q, k, v, g, beta, state, out_views, N) -> bool:
    """Whether the fused kernel takes this call (the planner checked the problem's scope; this, the
    tensors): 16-bit q, k, v with K = V = 128, a decay and beta per head; q, k, v and the outputs'
    base 16-byte aligned and their row strides multiples of 16 bytes (the launch layer's own
    buffers always are); the vectors' coordinates (N sequences) and a cache slot's offsets within
    int32."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if q.dtype not in (torch.bfloat16, torch.float16) or K != 128 or V != 128 or \
            (g is not None and g.dim() != 3) or (beta is not None and beta.dim() != 3):
        return False
    aligned = all(not x.is_contiguous() or x.data_ptr() % 16 == 0 for x in (q, k, v))
    if out_views is not None:
        o = out_views[0]
        aligned = aligned and o.data_ptr() % 16 == 0 and all(x * o.element_size() % 16 == 0 for x in o.stride()[1:3])
    in_slot = 0 if state is None else (K - 1) * abs(state.stride(2)) + (V - 1) * abs(state.stride(3))
    slots = (B * T) // CHUNK_SIZE + N
    return aligned and slots * HV * VECTOR_ROWS * CHUNK_SIZE < 2 ** 31 and in_slot < 2 ** 31


def fused_launch_steps(step_type, q, v, *, H, HV, K, V, N, T, scale, varlen, n_prep, has_g, has_h0, store_final,
                       s0, o_strides, ht_strides, beta_name, n_slots=0) -> tuple[dict, list]:
    """``(buffers, steps)`` of the fused prefill: the vectors ``vec`` and the flags (name ->
    (shape, dtype, fill)) and the three launches as ``step_type`` records (launch/delta.py's Step),
    for dense q ``[B, T, H, K]`` (varlen: B = 1) with N sequences; ``n_prep`` chunks of the stream
    (varlen: the descriptors' rows); ``s0`` the initial state's strides, ``o_strides`` (token,
    head) and ``ht_strides`` (sequence, head) the outputs'. ``n_slots`` > 0: the call's state is
    the cache ``state [n_slots, HV, K, V]`` at ``state_indices`` (``s0`` its strides; has_h0 and
    store_final unread)."""
    from ..kernels.gluon.delta_fused import (BT, BV, CHAIN_REGS, LOAD_REGS, MAXNREG, NUM_STAGES,
                                             PIPELINED_CHAIN_REGS, PIPELINED_PREP_REGS, PREP_REGS,
                                             gluon_fused_prefill_kernel)
    from .delta import product_dtype  # launch/delta.py imports this module
    B = q.shape[0]
    slots = (B * T) // CHUNK_SIZE + N
    d_pass = plan_delta.FUSED_DIAGONAL_FROM_PASS
    pipelined = plan_delta.FUSED_PIPELINED and d_pass
    buffers = {"vec": ((slots, HV, VECTOR_ROWS, CHUNK_SIZE), torch.float32, None),
               "flags": ((N * HV, V), torch.int32, None)}
    if d_pass:  # the WY matrix's diagonal 16 x 16 inverses, a chunk's rows of 16 (kernels/delta/chunk_vectors.py)
        buffers["dinv"] = ((slots, HV, CHUNK_SIZE, 16), torch.float16, None)
    vectors = dict(q=CallArg("q"), k=CallArg("k"), g=CallArg("g" if has_g else "q"), beta=CallArg(beta_name),
                   vec=CallArg("vec"), cu_seqlens=CallArg("cu_seqlens" if varlen else "q"),
                   chunk_indices=CallArg("chunk_indices_dp" if varlen else "q"), T=T, n_seq=N if varlen else 0,
                   H=H, HV=HV, K=K, BT=CHUNK_SIZE, IS_VARLEN=varlen, HAS_G=has_g, DINV=d_pass,
                   dinv=CallArg("dinv" if d_pass else "vec"), KK_DT=product_dtype(q.dtype))
    cache = n_slots > 0
    if cache:
        has_h0 = store_final = False
    h0 = "state" if cache else "initial_state" if has_h0 else "o"
    fused = dict(q=CallArg("q"), k=CallArg("k"), v=CallArg("v"), vec=CallArg("vec"),
                 dinv=CallArg("dinv" if d_pass else "vec"), o=CallArg("o"),
                 h0=CallArg(h0), ht=CallArg("final" if store_final else "o"), flags=CallArg("flags"),
                 cu_seqlens=CallArg("cu_seqlens" if varlen else "flags"),
                 state_indices=CallArg("state_indices" if cache else "flags"), scale=scale, T=T,
                 n_vec=slots * HV * VECTOR_ROWS * CHUNK_SIZE, n_slots=n_slots,
                 s0_n=s0[0], s0_h=s0[1], s0_k=s0[2], s0_v=s0[3],
                 o_st=o_strides[0], o_sh=o_strides[1], ht_n=ht_strides[0], ht_h=ht_strides[1],
                 H=H, HV=HV, K=K, V=V, BT=BT, BV=BV, NUM_STAGES=NUM_STAGES, IS_VARLEN=varlen, HAS_H0=has_h0,
                 STORE_FINAL=store_final, USE_CACHE=cache,
                 CHAIN_REGS=PIPELINED_CHAIN_REGS if pipelined else CHAIN_REGS,
                 PREP_REGS=PIPELINED_PREP_REGS if pipelined else PREP_REGS,
                 LOAD_REGS=LOAD_REGS, D_FROM_PASS=d_pass, PIPELINED=pipelined)
    steps = []
    if n_prep > 0:  # no launch of an empty grid
        steps.append(step_type(chunk_vectors_kernel, chunk_vectors_grid(n_prep, H), vectors, dict(num_warps=4)))
    if N * HV > 0:
        steps.append(step_type(gluon_fused_prefill_kernel, (N * HV,), fused, dict(num_warps=4, maxnreg=MAXNREG)))
        steps.append(flagged_token_loop(step_type, q, v, H=H, HV=HV, K=K, V=V, N=N, T=T, varlen=varlen,
                                        scale=scale, has_g=has_g, has_h0=has_h0, store_final=store_final, s0=s0,
                                        o_strides=o_strides, ht_strides=ht_strides, beta_name=beta_name,
                                        n_slots=n_slots))
    return buffers, steps


def flagged_token_loop(step_type, q, v, *, H, HV, K, V, N, T, varlen, scale, has_g, has_h0, store_final, s0,
                       o_strides, ht_strides, beta_name, n_slots=0):
    """The streaming kernel (kernels/stream/recurrence.py) with FLAGGED, as one ``step_type``
    record on launch/delta.py's call values: GDN with l2norm, a scalar decay (``g`` where
    ``has_g``) and beta per head (the call value ``beta_name``), from ``initial_state`` (or zeros)
    into ``o`` and ``final`` (``n_slots`` > 0: from and into the cache ``state`` at
    ``state_indices``, strides ``s0``), over the value columns flagged in ``flags [N * HV, V]``;
    q, k, v, g, beta contiguous (the launch makes them so). Its tile: the planner's
    streaming-prefill shape."""
    shape = stream_shape(StreamSizes(N * HV, K, V, T, 4), q.device)
    o_st, o_sh = o_strides
    qs = (T * H * K, H * K, K)
    vs = (T * HV * V, HV * V, V, 1)
    gs = (T * HV, HV, 1, 0)
    zero = dict.fromkeys(("sz_b", "sz_t", "sz_h", "sz_v", "sA_h", "sA_k", "sA_v", "sdb_h", "sdb_v", "sD_h", "sD_v",
                          "ss_n", "ss_t", "ss_h", "ss_k", "ss_v"), 0)
    strides = dict(sq_b=qs[0], sq_t=qs[1], sq_h=qs[2], sk_b=qs[0], sk_t=qs[1], sk_h=qs[2],
                   sv_b=vs[0], sv_t=vs[1], sv_h=vs[2], sv_d=vs[3], sg_b=gs[0], sg_t=gs[1], sg_h=gs[2], sg_d=gs[3],
                   sb_b=gs[0], sb_t=gs[1], sb_h=gs[2], sb_d=gs[3], so_b=T * o_st, so_t=o_st, so_h=o_sh,
                   s0_n=s0[0], s0_h=s0[1], s0_k=s0[2], s0_v=s0[3],
                   **(dict(s1_n=s0[0], s1_h=s0[1], s1_k=s0[2], s1_v=s0[3]) if n_slots else
                      dict(s1_n=ht_strides[0], s1_h=ht_strides[1], s1_k=V, s1_v=1)), **zero)
    cache = n_slots > 0
    absent = CallArg("o")
    kwargs = dict(q=CallArg("q"), k=CallArg("k"), v=CallArg("v"), g=CallArg("g") if has_g else absent,
                  beta=CallArg(beta_name), o=CallArg("o"), A=absent, dt_bias=absent, D=absent, z=absent,
                  h0=CallArg("state") if cache else CallArg("initial_state") if has_h0 else absent, hin=absent,
                  ht=CallArg("state") if cache else CallArg("final") if store_final else absent,
                  slots=CallArg("state_indices") if cache else absent, snaps=absent, accepted=absent,
                  cu_seqlens=CallArg("cu_seqlens") if varlen else absent, flags=CallArg("flags"),
                  scale=scale, T=T, t_begin=0, t_end=T, n_snap=0, n_slots=n_slots, **strides,
                  H=H, HV=HV, K=K, V=V, BK=shape.BK, BV=shape.BV, DELTA=True, GATE=1 if has_g else 0, BETA=1,
                  L2NORM=True, DT_TIED=False, A_TIED=True, DT_SOFTPLUS=False, HAS_DT_BIAS=False, HAS_D=False,
                  HAS_Z=False, USE_H0=has_h0 or cache, STORE_HT=store_final or cache, HT_BY_SLOT=cache,
                  HAS_SLOTS=cache, STEPS=0,
                  HAS_ACCEPTED=False, VARLEN=varlen, HANDOFF=False, PREFETCH=T > 1, EVICT=shape.evict, FLAGGED=True)
    grid = (N * HV * triton.cdiv(V, shape.BV),)
    return step_type(streaming_recurrence_kernel, grid, kwargs, dict(num_warps=shape.num_warps,
                                                                     num_stages=shape.num_stages))
