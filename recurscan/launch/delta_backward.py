"""The launches of the chunked delta rule's backward, kernels/delta/backward.py (GDN, and GDP on its
expanded stream, :func:`chunk_delta_product_bwd`):

1. the forward's sweep again for the states entering every chunk (its chunk states, in the
   inputs' dtype), each chunk's U and lam o (K S); no outputs;
2. before it, unless the forward kept its prep's outputs (``prep``), the prep with STORE_INV, which
   writes ``G o Tinv`` beside wy (``aqk``, ``coef`` kept);
3. the reverse sweep (dS carried last chunk to first; dv, dY, dS per chunk, dh0), which reads none
   of 1's outputs: with ``DeltaBackwardShape.corun`` (the planner's) and the prep kept, it is
   launched first and 1 runs beside it on a side stream, joined before 4;
4. the parallel stage (dq, dk, dg, dbeta): the [BT, BT] side with dbeta and dg's part
   (``scores``, one program per chunk and value head), then dk and dq with dg's state terms (one
   launch each, one program per chunk and value head, or per chunk and q/k head where it sums a
   GVA group itself: ``DeltaBackwardShape.group_in_kernel``, the planner's);
5. under GVA without that, the sum of dq and dk over each group's value heads, cast to q's and k's
   dtypes (kernels/group_sum.py).

Saved from the forward: the inputs, and the prep's outputs where the planner keeps them
(``plan.delta.keep_prep_for_backward``); every scratch here lives for the call. What a call
of one signature launches is built once (:func:`build_delta_backward`) and kept in
:data:`BACKWARD_LAUNCHES`: later calls allocate and launch, through the compiled kernels directly.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import triton
import triton.language as tl

from ..descriptors import CHUNK_SIZE
from ..kernels.delta.backward import (DQDK_BOTH, DQDK_DK, DQDK_DQ, chunk_delta_bwd_dqdk_kernel,
                                      chunk_delta_bwd_scores_kernel, chunk_delta_bwd_sweep_kernel)
from ..kernels.delta.prep import chunk_delta_prep_kernel
from ..kernels.group_sum import group_sum_kernel
from ..plan import delta as _plan
from ..plan.delta import DeltaBackwardShape, DeltaShape
from ..plan.device import sm_count
from ..runtime.cache import SignatureCache, launch_key
from ..runtime.launcher import CallArg, compile_in_background
from ..runtime.streams import fork_side_stream
from .delta import (BUFFER_NAMES, CALL_NAMES, INTERPRET, PREP_NAMES, TEST_SHAPE, DeltaInputs, DeltaLaunches, Step,
                    _empty, allocate_buffers, build_delta_launches, is_sweep_step, kept_prep_names, launch_steps,
                    run_delta_launches)

#: The per-call tensors of the two backward stages, by name (their launches' CallArgs).
NAMES = ("q", "k", "v", "g", "beta", "do", "dht", "cu_seqlens", "chunk_indices", "chunk_offsets",
         "winv", "aqk", "coef", "states", "u", "ks", "dstates", "dh0", "dy", "dv", "dq", "dk", "dg", "dbeta", "bdyks",
         "scratch", "dq_sum", "dk_sum")

#: Rows (token x q/k head) a program of the GVA group sum takes.
GROUP_SUM_ROWS = 32

#: Registers a thread under the warp-specialised stages' launch cap (the scores kernel's, dq and
#: dk's): two warpgroups and a load warp launch as 12 warps (the load warp padded to its
#: warpgroup), 384 threads x 168 within the 64 K registers of an SM; setmaxnreg then moves them
#: between the partitions as the kernels' *_REGS say (the scores kernel: 240 a warpgroup, 24 the
#: load warp; dq and dk: 240 the epilogue, 32 the load warp, the sums warpgroup what is left).
SPECIALIZED_STAGE_MAXNREG = 168

#: Signature -> :class:`DeltaBackwardLaunches`.
BACKWARD_LAUNCHES = SignatureCache("delta backward")


@dataclasses.dataclass
class DeltaBackwardLaunches:
    """A backward call's launches for one signature: the forward again (chunk states; its prep
    with STORE_INV also writes G o Tinv), then ``steps`` (the reverse sweep and the parallel stage, per-call tensors by
    :data:`NAMES`) on ``buffers`` (name -> (shape, dtype)). Under GVA (``gva``), the stages write
    dq and dk per value head in float32 and the last two steps sum them over each group into
    ``dq_sum`` and ``dk_sum``."""

    forward: DeltaLaunches
    steps: list
    buffers: dict
    gva: bool
    corun: bool = False  # the recompute on a side stream beside the reverse sweep (DeltaBackwardShape.corun)
    compiled: bool = False  # a call has run (and compiled every kernel)
    pending: object = None  # waits for the compiles a forward started (compile_backward_early), or None


def build_delta_backward(q, k, v, g, beta, do, dht, *, scale, initial_state, use_qk_l2norm_in_kernel,
                         cu_seqlens, chunk_indices, chunk_offsets, shape: DeltaShape,
                         backward_shape: DeltaBackwardShape, num_householder: int = 1,
                         prep_kept: bool = False, checkpoint_chunks: int = 0) -> DeltaBackwardLaunches:
    """What :func:`chunk_delta_bwd` launches for these tensors' signature (none is kept).
    ``prep_kept``: the forward kept its prep's outputs, so the recompute runs its sweep alone.
    ``checkpoint_chunks`` E > 0: the forward kept the state entering every E-th token chunk
    (``checkpoints``), so the recompute sweeps every segment of E chunks at once (PASS 2)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    M = num_householder
    BT = CHUNK_SIZE
    varlen = cu_seqlens is not None
    N = cu_seqlens.shape[0] - 1 if varlen else B
    # The recompute (its sweep storing U and lam o K S) on the Triton sweep, the forward sweep's twin
    # (recompute_twin) or its warp-specialised form (recompute_specialized: from the sequence's
    # start, on a row of the twin's kind, GDN); a sweep's phases kept, in one segment.
    shape = dataclasses.replace(backward_shape.recompute or dataclasses.replace(shape, segments=1), specialized=False)
    if shape.gluon_sweep and not backward_shape.recompute_twin:
        shape = dataclasses.replace(shape, gluon_sweep=False, phase_ratio=None)
    if backward_shape.recompute_specialized:
        if not _plan.gluon_sweep_scope(householder=M, dtype=q.dtype, key_dim=K, value_dim=V):
            raise ValueError("DeltaBackwardShape.recompute_specialized: the warp-specialised recompute takes GDN "
                             f"(M = 1), 16-bit inputs, K 64 or 128 and V a multiple of 64 (got M = {M}, {q.dtype}, "
                             f"K = {K}, V = {V})")
        if not checkpoint_chunks and shape.block_v == 64 and shape.num_warps == 4 and shape.v_product and \
                not shape.group_prep:
            shape = dataclasses.replace(shape, gluon_sweep=True, specialized=True)
    if checkpoint_chunks:  # one prep (unless kept), then one sweep launch over every segment
        shape = dataclasses.replace(shape, phases=1)
    rows = chunk_indices.shape[0] if varlen else B * triton.cdiv(T * M, BT)  # chunks of the expanded stream
    common = dict(initial_state=initial_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale,
                  cu_seqlens=cu_seqlens, chunk_indices_dp=chunk_indices, chunk_offsets=chunk_offsets)
    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    # Product operands in the inputs' dtype (the interpreter multiplies bf16 tiles wrongly: float32 there).
    dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[q.dtype]
    dt = tl.float32 if INTERPRET and dt == tl.bfloat16 else dt
    operand_dtype = torch.float32 if dt == tl.float32 else q.dtype
    # 1-2. The forward again, for the states entering every chunk (in the inputs' dtype: the product
    #      operand they become), its prep storing G o Tinv beside wy.
    forward = build_delta_launches(q, k, v, g, beta, shape, num_householder=M, return_chunk_states=True,
                                   num_chunk_rows=rows, chunk_states_dtype=q.dtype, expanded_chunk_states=M > 1,
                                   **common)
    # The sweep for the states alone (no outputs, so no replay of non-finite outputs either).
    # It also stores each chunk's U and lam o (K S), which the parallel stage would otherwise
    # recompute from the states (in the products' operand dtype).
    steps = [dataclasses.replace(s, kwargs=dict(s.kwargs, STORE_INV=True, winv=CallArg("winv")))
             if s.kernel is chunk_delta_prep_kernel else
             dataclasses.replace(s, kwargs=dict(s.kwargs, OUTPUTS=False, TMA_STORE=False, STORE_U=True,
                                                u_out=CallArg("u"), ks_out=CallArg("ks")))
             if is_sweep_step(s) else s
             for s in forward.steps if not s.kwargs.get("REPLAY")
             and not (prep_kept and s.kernel is chunk_delta_prep_kernel)]
    if checkpoint_chunks:
        steps = [_from_checkpoints(s, N, T, HV, V, checkpoint_chunks) if is_sweep_step(s) else s
                 for s in steps]
    # Every chunk state a stage reads is written (a padding chunk's program reads none): no fill.
    per_row = (B, T * M, HV, V)
    # The output is never written (OUTPUTS=False): one element carries its dtype to the kernel.
    forward = dataclasses.replace(forward, steps=steps, buffers=dict(
        forward.buffers, o=((1,),) + forward.buffers["o"][1:],
        chunk_states=forward.buffers["chunk_states"][:2] + (None,), winv=forward.buffers["wy"],
        u=(per_row, operand_dtype, None), ks=(per_row, operand_dtype, None)),
        outputs=("chunk_states", "winv", "aqk", "coef", "u", "ks"))
    BK = max(16, triton.next_power_of_2(K))
    BV = min(backward_shape.block_v, max(16, triton.next_power_of_2(V)))
    BVg = min(backward_shape.grads_block_v, max(16, triton.next_power_of_2(V)))
    BVs = min(backward_shape.scores_block_v or BVg, max(16, triton.next_power_of_2(V)))
    chunks = rows
    # GVA: dq and dk summed over each group's value heads inside their kernel (GROUP), or written
    # per value head in float32 and summed after (group_sum_kernel).
    group = HV // H if backward_shape.group_in_kernel else 1
    gva = HV != H and group == 1
    f32 = torch.float32
    # dY and dS per chunk in the inputs' dtype: the parallel stage takes them as product operands.
    # Uninitialised: every row of a sequence is written (padding chunks cover no row).
    # dq and dg on the token stream [B, T, ...]; the rest on the expanded one [B, T * M, ...].
    buffers = dict(dstates=((rows, HV, K, V), q.dtype), dy=((B, T * M, HV, V), q.dtype),
                   dv=((B, T * M, HV, V), v.dtype), dq=((B, T, HV // group, K), f32 if gva else q.dtype),
                   dk=((B, T * M, HV // group, K), f32 if gva else k.dtype), dbeta=((B, T * M, HV), f32),
                   bdyks=((B, T * M, HV), f32), scratch=((chunks * HV, 2, BT, BT), q.dtype))
    if g is not None:
        buffers["dg"] = ((B, T, HV), f32)
    if initial_state is not None:
        buffers["dh0"] = ((N, HV, K, V), f32)
    arg = lambda name, present=True: CallArg(name if present else "dv")  # noqa: E731 (absent: a placeholder)
    sweep_kernel = chunk_delta_bwd_sweep_kernel
    if backward_shape.gluon_sweep:  # its Gluon twin: the same arguments (kernels/gluon)
        if BV != 64 or not _plan.gluon_reverse_sweep_scope(householder=M, dtype=q.dtype, key_dim=K, value_dim=V):
            raise ValueError("DeltaBackwardShape.gluon_sweep: the Gluon reverse sweep takes M 1 or 2, 16-bit inputs, "
                             f"K 64 or 128 and V a multiple of block_v = 64 (got M = {M}, {q.dtype}, K = {K}, "
                             f"V = {V}, block_v = {backward_shape.block_v})")
        from ..kernels.gluon.delta_backward_sweep import gluon_bwd_sweep_kernel as sweep_kernel
    sweep = Step(sweep_kernel, (N * HV * triton.cdiv(V, BV),), dict(
        q=arg("q"), k=arg("k"), beta=arg("beta"), do=arg("do"), winv=arg("winv"), aqk=arg("aqk"), coef=arg("coef"),
        dstates=arg("dstates"), dht=arg("dht", dht is not None), dh0=arg("dh0", initial_state is not None),
        dy_out=arg("dy"), dv=arg("dv"), cu_seqlens=arg("cu_seqlens", varlen),
        chunk_offsets=arg("chunk_offsets", varlen), T=T, n_cs_rows=rows,
        H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, IS_VARLEN=varlen, HAS_DHT=dht is not None,
        STORE_DH0=initial_state is not None, DOT_PRECISION=dot_precision, DT=dt, M=M,
        NUM_STAGES=backward_shape.sweep_stages),
        dict(num_warps=backward_shape.sweep_warps))
    shared = dict(q=arg("q"), k=arg("k"), g=arg("g", g is not None), beta=arg("beta"), do=arg("do"), dy=arg("dy"),
                  u=arg("u"), dg=arg("dg", g is not None), bdyks=arg("bdyks"), scratch=arg("scratch"),
                  cu_seqlens=arg("cu_seqlens", varlen), chunk_indices=arg("chunk_indices", varlen),
                  chunk_offsets=arg("chunk_offsets", varlen), T=T, n_seq=N, scale=scale,
                  H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BVg, IS_VARLEN=varlen, HAS_G=g is not None,
                  USE_L2NORM=use_qk_l2norm_in_kernel, DOT_PRECISION=dot_precision, DT=dt, M=M)
    scores_kwargs = dict(shared, v=arg("v"), ks=arg("ks"), dbeta=arg("dbeta"), BV=BVs)
    if backward_shape.gluon_scores:  # warp-specialised in Gluon (kernels/gluon): persistent, one program an SM
        if not _plan.gluon_scores_scope(householder=M, dtype=q.dtype, key_dim=K, value_dim=V):
            raise ValueError("DeltaBackwardShape.gluon_scores: the Gluon scores kernel takes M 1 or 2, 16-bit inputs, "
                             f"K 64 or 128 and V a multiple of 64 (got M = {M}, {q.dtype}, K = {K}, V = {V})")
        from ..kernels.gluon.delta_backward_scores_specialized import gluon_bwd_scores_specialized_kernel
        scores = Step(gluon_bwd_scores_specialized_kernel, (max(1, min(chunks * HV, sm_count(q.device))),),
                      dict(scores_kwargs, BV=64, n_chunks=chunks, NUM_STAGES=_plan.GLUON_SCORES_STAGES),
                      dict(num_warps=4, maxnreg=SPECIALIZED_STAGE_MAXNREG))
    else:
        scores = Step(chunk_delta_bwd_scores_kernel, (chunks * HV,), scores_kwargs,
                      dict(num_warps=backward_shape.scores_warps or backward_shape.grads_warps))
    dqdk = dict(shared, states=arg("states"), dstates=arg("dstates"), dq=arg("dq"), dk=arg("dk"), n_cs_rows=rows)
    if backward_shape.gluon_dqdk:  # its Gluon twin, dk and dq in one launch (kernels/gluon)
        stages = backward_shape.gluon_dqdk_stages
        if backward_shape.gluon_dqdk_specialized and M != 1:
            raise ValueError("DeltaBackwardShape.gluon_dqdk_specialized: the warp-specialised dq, dk kernel takes "
                             f"M = 1 (got M = {M}); gluon_dqdk alone takes M = 2")
        if not _plan.gluon_dqdk_scope(householder=M, heads=H, value_heads=HV, dtype=q.dtype, key_dim=K, value_dim=V,
                                      stages=stages) or gva:
            raise ValueError("DeltaBackwardShape.gluon_dqdk: the Gluon dq, dk kernel takes M = 1 with H = HV or a GVA "
                             f"group of at most {_plan.GLUON_DQDK_GROUP} value heads summed in the kernel "
                             "(group_in_kernel), or M = 2 with H = HV; 16-bit inputs, K 64 or 128 and V a "
                             f"multiple of 32, at least gluon_dqdk_stages = {stages} steps of 32 (got M = {M}, "
                             f"H = {H}, HV = {HV}, group_in_kernel = {backward_shape.group_in_kernel}, {q.dtype}, "
                             f"K = {K}, V = {V})")
        # Persistent programs, one an SM, each taking the twin's (chunk, value heads) items in turn.
        programs = max(1, min(chunks * (HV // group), sm_count(q.device)))
        kwargs = dict(dqdk, PART=DQDK_BOTH, GROUP=group, BV=32)
        if backward_shape.gluon_dqdk_specialized and group <= _plan.GLUON_DQDK_SPECIALIZED_GROUP:
            # the sums beside the epilogue
            from ..kernels.gluon.delta_backward_dqdk_specialized import gluon_bwd_dqdk_specialized_kernel
            grads = [Step(gluon_bwd_dqdk_specialized_kernel, (programs,),
                          dict(kwargs, n_programs=programs, NUM_STAGES=_plan.GLUON_DQDK_SPECIALIZED_STAGES),
                          dict(num_warps=4, maxnreg=SPECIALIZED_STAGE_MAXNREG))]
        else:
            from ..kernels.gluon.delta_backward_dqdk import gluon_bwd_dqdk_kernel
            grads = [Step(gluon_bwd_dqdk_kernel, (programs,), dict(kwargs, NUM_STAGES=stages), dict(num_warps=8))]
    else:
        grads = [Step(chunk_delta_bwd_dqdk_kernel, (chunks * (HV // group),), dict(dqdk, PART=part, GROUP=group),
                      dict(num_warps=backward_shape.grads_warps))
                 for part in ((DQDK_BOTH,) if backward_shape.dqdk_one_launch else (DQDK_DK, DQDK_DQ))]
    steps = [sweep, scores] + grads
    if gva:  # dq, dk per value head -> per q/k head, in q's and k's dtypes
        buffers.update(dq_sum=((B, T, H, K), q.dtype), dk_sum=((B, T * M, H, K), k.dtype))
        for name, rows_of in (("dq", B * T * H), ("dk", B * T * M * H)):
            steps.append(Step(group_sum_kernel, (triton.cdiv(rows_of, GROUP_SUM_ROWS),), dict(
                x=arg(name), out=arg(name + "_sum"), rows=rows_of, GROUP=HV // H, K=K, BK=BK, BR=GROUP_SUM_ROWS),
                dict(num_warps=4)))
    return DeltaBackwardLaunches(forward, steps, buffers, gva, corun=backward_shape.corun and prep_kept)


def _from_checkpoints(sweep, N: int, T: int, HV: int, V: int, every: int):
    """The recompute's sweep as one PASS 2 launch over segments of ``every`` token chunks, each from
    the forward's checkpoint of its first chunk (``seg_n``, :func:`build_delta_launches`'s
    ``checkpoint_chunks``): the chain is ``every`` chunks long instead of the sequence's."""
    segments = triton.cdiv(triton.cdiv(T, CHUNK_SIZE), every)
    NV = triton.cdiv(V, sweep.kwargs["BV"])
    kwargs = dict(sweep.kwargs, PASS=2, seg_n=CallArg("checkpoints"), n_seg=segments, seg_chunks=every)
    return dataclasses.replace(sweep, grid=(N * segments * HV * NV,), kwargs=kwargs)


def _gluon_takes(q, k, v, do, chunk_indices, value_heads: int) -> bool:
    """What the Gluon twins need of a call beyond the planner's scope: q, k, v and dO
    16-byte aligned and of one dtype (their bulk copies read them from their base), and row
    coordinates within int32 in their descriptors over the chunk states (K rows a chunk of the
    expanded stream, k's rows, and value head) and the scratch (2 BT rows a chunk and value head)."""
    rows = chunk_indices.shape[0] if chunk_indices is not None else k.shape[0] * triton.cdiv(k.shape[1], CHUNK_SIZE)
    return all(x.data_ptr() % 16 == 0 and x.dtype == q.dtype for x in (q, k, v, do)) and \
        rows * value_heads * max(q.shape[3], 2 * CHUNK_SIZE) < 2 ** 31


def _backward_call(q, k, v, g, beta, do, dht, *, num_householder, scale, initial_state, use_qk_l2norm_in_kernel,
                   cu_seqlens, chunk_indices, chunk_offsets, shape, backward_shape, prep_kept, checkpoint_chunks=0,
                   gluon=True):
    """The tensors as the stages index them (dense; beta of ones where None), the scale, and the
    launches of their signature (built on the signature's first call). ``gluon``: the planner may
    give a stage to its Gluon twin (False: ``backend="triton"``, the Triton kernels only)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    shape = shape or TEST_SHAPE
    # The stages index these as dense [B, T, heads, dim] (and dht as [N, HV, K, V]): any strided input is copied.
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    g = None if g is None else g.contiguous()
    beta = torch.ones(v.shape[:3], dtype=q.dtype, device=q.device) if beta is None else beta.contiguous()
    dht = None if dht is None else dht.float().contiguous()
    tensors = (q, k, v, g, beta, do, dht, initial_state, cu_seqlens, chunk_indices, chunk_offsets)
    key = (launch_key(tensors), num_householder, scale, use_qk_l2norm_in_kernel, shape, backward_shape, prep_kept,
           checkpoint_chunks, gluon)
    launches = BACKWARD_LAUNCHES.get(key)
    if launches is None:  # the signature's first call: planned (from the key's contents alone), then built
        if backward_shape is None:
            pairs = (cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]) * v.shape[2]
            backward_shape = _plan.delta_backward_shape(pairs, v.shape[3], q.device, v.shape[2] // q.shape[2])
            backward_shape = _plan.gluon_twins(backward_shape, householder=num_householder, heads=q.shape[2],
                                               value_heads=v.shape[2], key_dim=q.shape[3], value_dim=v.shape[3],
                                               dtype=q.dtype, device=q.device, twin_only=not gluon)
        if (backward_shape.gluon_sweep or backward_shape.gluon_dqdk or backward_shape.gluon_scores) and \
                not _gluon_takes(q, k, v, do, chunk_indices, v.shape[2]):
            backward_shape = dataclasses.replace(backward_shape, gluon_sweep=False, gluon_dqdk=False,
                                                 gluon_scores=False)
        launches = BACKWARD_LAUNCHES.put(key, build_delta_backward(
            q, k, v, g, beta, do, dht, scale=scale, initial_state=initial_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
            chunk_offsets=chunk_offsets, shape=shape, backward_shape=backward_shape, num_householder=num_householder,
            prep_kept=prep_kept, checkpoint_chunks=checkpoint_chunks))
    given = dict(q=q, k=k, v=v, g=g, beta=beta, do=do, dht=dht, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
                 chunk_offsets=chunk_offsets)
    return launches, given


def _stand_ins(buffers: dict, device) -> dict:
    """16-element tensors of each buffer's dtype: what a compile needs of a pointer argument (its
    dtype, and an alignment every allocation has) without the buffer's memory."""
    return {n: torch.empty(16, dtype=spec[1], device=device) for n, spec in buffers.items()}


#: The recompute's outputs the stages read: (the stages' name, the recompute's buffer).
RECOMPUTED = (("states", "chunk_states"), ("winv", "winv"), ("aqk", "aqk"), ("coef", "coef"), ("u", "u"),
              ("ks", "ks"))


def _compile_stages(launches: DeltaBackwardLaunches, given: dict, buffers: dict, device):
    """Start compiling the stages on a thread of their own (:func:`compile_in_background`), stand-ins
    in place of the recompute's outputs; ``buffers``: the stages' own buffers (or stand-ins).
    Returns the wait."""
    recomputed = _stand_ins({n: launches.forward.buffers[b] for n, b in RECOMPUTED}, device)
    values = tuple(given[n] if n in given else recomputed.get(n, buffers.get(n)) for n in NAMES)
    return compile_in_background([(s.kernel, s.grid, s.kwargs, s.options) for s in launches.steps], NAMES, values,
                                 device)


#: The forward signatures whose backward :func:`compile_backward_early` has seen.
EARLY_SIGNATURES: set = set()


def output_stand_ins(q, k, v, cu_seqlens) -> tuple:
    """Empty tensors with the signature of the forward's outputs, which the backward's dO and dht
    take: o [B, T, HV, V] in q's dtype (on the token stream) and the final state [N, HV, K, V] in
    float32."""
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return (q.new_empty(q.shape[:2] + v.shape[2:]),
            q.new_empty((N, v.shape[2], k.shape[3], v.shape[3]), dtype=torch.float32))


def compile_backward_early(signature, q, k, v, g, beta, o=None, final=None, *, num_householder=1, scale=None,
                           initial_state=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices=None,
                           chunk_offsets=None, shape: DeltaShape | None = None,
                           backward_shape: DeltaBackwardShape | None = None, prep_kept: bool = False,
                           checkpoint_chunks: int = 0, gluon: bool = True, final_read: bool = True):
    """Called by a forward under autograd before it runs: on the first call of the forward's
    ``signature`` (a hashable key; None: nothing is done), build the backward's launches and
    start compiling every kernel they launch (the recompute's and the stages') on background
    threads, beside the forward's own compiles; the backward's first call waits for them. ``o``
    and ``final`` carry the signatures of dO and dht (None: :func:`output_stand_ins`, made only on
    a signature's first call). ``final_read``: whether the caller receives the final state (if not,
    the backward's dht is None: autograd sends no cotangent for it). Other arguments as
    :func:`chunk_delta_bwd` takes them (GDP: the expanded stream's descriptors). Later calls of the
    signature return at once."""
    if INTERPRET or signature is None or signature in EARLY_SIGNATURES:
        return
    EARLY_SIGNATURES.add(signature)
    if o is None or final is None:
        o, final = output_stand_ins(q, k, v, cu_seqlens)
    final = final if final_read else None
    if num_householder > 1 and cu_seqlens is not None:  # as chunk_delta_product_bwd passes them
        chunk_offsets = expanded_chunk_offsets(cu_seqlens, num_householder)
    launches, given = _backward_call(q, k, v, g, beta, torch.empty_like(o), final, num_householder=num_householder,
                                     scale=scale, initial_state=initial_state,
                                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                     chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, shape=shape,
                                     backward_shape=backward_shape, prep_kept=prep_kept,
                                     checkpoint_chunks=checkpoint_chunks, gluon=gluon)
    if launches.compiled or launches.pending is not None:
        return
    recompute = launches.forward
    inputs = DeltaInputs(given["q"], given["k"], given["v"], given["g"], given["beta"], initial_state, None, None,
                         cu_seqlens, chunk_indices, chunk_offsets)
    fake = _stand_ins(dict(recompute.buffers, **({"checkpoints": (None, torch.float32)} if checkpoint_chunks else {})),
                      q.device)  # the checkpoints come from the forward: a stand-in carries their signature
    waits = [compile_in_background([(s.kernel, s.grid, s.kwargs, s.options) for s in recompute.steps], CALL_NAMES,
                                   tuple(inputs) + tuple(fake.get(n) for n in BUFFER_NAMES), q.device)]
    waits.append(_compile_stages(launches, given, _stand_ins(launches.buffers, q.device), q.device))
    launches.pending = lambda: [w() for w in waits]


def chunk_delta_bwd(q, k, v, g, beta, do, dht=None, *, num_householder=1, scale=None, initial_state=None,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                    shape: DeltaShape | None = None, backward_shape: DeltaBackwardShape | None = None,
                    prep: tuple | None = None, checkpoints: torch.Tensor | None = None, checkpoint_chunks: int = 0,
                    gluon: bool = True):
    """Gradients ``(dq, dk, dv, dg, dbeta, dh0)`` of ``chunk_delta_fwd``'s ``(o, final_state)``
    given ``do [B, T, HV, V]`` and ``dht [N, HV, K, V]`` (None: zeros). Shapes as the forward's:
    q, g and do on the token stream, k, v and beta on the expanded one (``T * M`` rows, M =
    ``num_householder``). With ``cu_seqlens`` (token boundaries), ``chunk_indices`` and
    ``chunk_offsets`` of the expanded stream (``chunk_indices_dp`` and
    :func:`expanded_chunk_offsets`) are required. ``shape`` is the forward's launch shape,
    ``backward_shape`` the stages' (None: the planner's, ``plan.delta.delta_backward_shape``).
    dq, dk and dv in the inputs' dtypes, dg, dbeta and dh0 float32; None where
    the input was None (g, beta, initial_state). ``prep``: the forward's prep outputs ``(wy, winv,
    aqk, coef[, sequence_order])`` (``build_delta_launches(..., keep_prep=True)``, the last one
    varlen), which the recompute then takes instead of running its prep; None: it runs it.
    ``checkpoints`` (dense only): the forward's float32 states entering every ``checkpoint_chunks``-th
    token chunk (``build_delta_launches(..., checkpoint_chunks=E)``), from which the recompute sweeps
    every segment at once; None: it sweeps each sequence from its initial state. ``gluon``: the
    planner may run a stage as its Gluon twin (``plan.delta.gluon_twins``); False, the
    Triton kernels only. No host synchronisation."""
    beta_given = beta is not None
    if checkpoints is not None:  # read by row and column offsets from these sizes: checked, not trusted
        every = checkpoint_chunks
        rows = triton.cdiv(triton.cdiv(q.shape[1], CHUNK_SIZE), every) if isinstance(every, int) and every > 0 else None
        want = (q.shape[0], rows, v.shape[2], k.shape[3], v.shape[3])
        if cu_seqlens is not None or rows is None or tuple(checkpoints.shape) != want or \
                checkpoints.dtype != torch.float32 or not checkpoints.is_contiguous():
            raise ValueError(f"chunk_delta_bwd: checkpoints must be the dense forward's float32 states every "
                             f"checkpoint_chunks = E > 0 chunks, contiguous {list(want)} (E = {every!r}), got "
                             f"{tuple(checkpoints.shape)} {checkpoints.dtype}"
                             + (" with cu_seqlens" if cu_seqlens is not None else ""))
    launches, given = _backward_call(q, k, v, g, beta, do, dht, num_householder=num_householder, scale=scale,
                                     initial_state=initial_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                     cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                                     shape=shape, backward_shape=backward_shape, prep_kept=prep is not None,
                                     checkpoint_chunks=checkpoint_chunks if checkpoints is not None else 0,
                                     gluon=gluon)
    q = given["q"]
    inputs = DeltaInputs(q, given["k"], given["v"], given["g"], given["beta"], initial_state, None, None, cu_seqlens,
                         chunk_indices, chunk_offsets)
    made = {n: _empty(*s, dtype=d, device=q.device) for n, (s, d) in launches.buffers.items()}
    wait = lambda: None  # noqa: E731
    if launches.pending is not None:  # compiling since the forward (compile_backward_early)
        launches.pending()
        launches.pending = None
    elif not launches.compiled and not INTERPRET:  # the stages compile beside the recompute's kernels
        wait = _compile_stages(launches, given, made, q.device)
    kept = {} if prep is None else dict(zip(kept_prep_names(len(prep) > len(PREP_NAMES)), prep))
    if checkpoints is not None:
        kept["checkpoints"] = checkpoints
    # The recompute's buffers are allocated here, on the calling stream, even when a side stream
    # fills them: the join below orders every later use and reuse of them after its work.
    recompute_buffers = allocate_buffers(launches.forward, kept)
    given.update({n: recompute_buffers[b] for n, b in RECOMPUTED})
    values = tuple(given[n] if n in given else made.get(n) for n in NAMES)
    if launches.corun:  # the reverse sweep first, then the recompute beside it (it reads none of its outputs)
        wait()
        side = fork_side_stream(q.device)  # before the reverse sweep's launch, which it must not wait for
        launch_steps(launches.steps[:1], values, NAMES)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            run_delta_launches(launches.forward, inputs, given=recompute_buffers)
        if side is not None:
            torch.cuda.current_stream(q.device).wait_stream(side)
        launch_steps(launches.steps[1:], values, NAMES)
    else:
        run_delta_launches(launches.forward, inputs, given=recompute_buffers)
        wait()
        launch_steps(launches.steps, values, NAMES)
    launches.compiled = True
    dq, dk = (made["dq_sum"], made["dk_sum"]) if launches.gva else (made["dq"], made["dk"])
    return dq, dk, made["dv"], made.get("dg"), made["dbeta"] if beta_given else None, made.get("dh0")


def expanded_chunk_offsets(cu_seqlens: torch.Tensor, num_householder: int) -> torch.Tensor:
    """``chunk_offsets`` of the Householder-expanded stream (``cu_seqlens * M``), computed on the
    device (no host synchronisation): ``[0, cumsum(ceil(M L_n / 64))]``, int32."""
    chunks = torch.div((cu_seqlens[1:] - cu_seqlens[:-1]) * num_householder + CHUNK_SIZE - 1, CHUNK_SIZE,
                       rounding_mode="floor")
    return torch.cat([chunks.new_zeros(1), torch.cumsum(chunks, 0)]).to(torch.int32)


def chunk_delta_product_bwd(q, k, v, g, beta, num_householder, do, dht=None, *, scale=None, initial_state=None,
                            use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_indices_dp=None,
                            shape: DeltaShape | None = None, backward_shape: DeltaBackwardShape | None = None,
                            prep: tuple | None = None, gluon: bool = True):
    """Gated Delta Product's gradients: the stages run on the expanded stream (each token's M
    Householder copies), reading q and dO on each token's last copy and g on its first, and write
    dq and dg on the token stream. Shapes as ``chunk_gated_delta_product_varlen``'s;
    ``chunk_indices_dp``: the expanded stream's chunk pairs (the forward's descriptors; None: formed
    here on the device, padded to q's T); its chunk offsets are computed on the device."""
    M = num_householder
    desc = {}
    if cu_seqlens is not None:
        if chunk_indices_dp is None:
            from .descriptors import device_descriptors
            chunk_indices_dp = device_descriptors(cu_seqlens, M, tokens=q.shape[1]).chunk_indices_dp
        desc = dict(chunk_indices=chunk_indices_dp, chunk_offsets=expanded_chunk_offsets(cu_seqlens, M))
    return chunk_delta_bwd(q, k, v, g, beta, do, dht, num_householder=M, scale=scale, initial_state=initial_state,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, shape=shape,
                           backward_shape=backward_shape, prep=prep, gluon=gluon, **desc)
