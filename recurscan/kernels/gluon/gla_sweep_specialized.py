"""The forward sweep warp-specialised: of a scalar decay on the group prep's scores (SSD, GLA under
GVA), the same arithmetic as the Gluon twin :func:`recurscan.kernels.gluon.delta_sweep.
gluon_sweep_kernel` with the WY step off and GATE_SCORES, or with WY of the delta rule on the delta
prep's wy and aqk (GDN), the twin's arithmetic with the WY step (so the Triton sweep's bits, which
that twin has), on three partitions of one program. With SWEEP_SCORES (simple GLA: a query/key head
a value head) the outputs form the scores K Q^T from the ring's tiles themselves, the Triton
sweep's form of the same flag (its bits). The WY form, per chunk:

    chain:   K S, U^T = V^T wy^T - (lam rk o K S) wy^T, then S^T <- lam_last S^T + (U^T o gam rk) K,
             handing S^T (at the chunk's start) and U^T (before the state's product) over
    outputs: O^T = U^T aqk^T + lam rq o (S^T Q^T), U^T read from the outputs' own staging buffer

so the chain's step holds three dependent products and the outputs' two run beside the next
chunks' chain. With STORE_U and no outputs (the backward's recompute, WY only) the chain also hands
lam rk o K S over beside U^T and the state S, and the two warpgroups store all three (the chunk
state to its row, U and K S to ``u_out`` and ``ks_out``): the chain issues no store; no q or aqk
tile is loaded. The scalar decay's form:

1. the **chain** (the default partition, one warpgroup): S^T [BV, K] float32 in registers; per
   chunk it hands the state entering the chunk to the outputs through a shared-memory buffer (two
   of them, one for each outputs warpgroup), then forms the next state,
   S^T <- lam_last S^T + (V^T o gam) K;
2. the **outputs** (two warpgroups, alternate chunks each): per chunk, S^T Q^T from the handed-over
   state, the gate tile from the scores (with SWEEP_SCORES first formed, K Q^T), O^T = V^T gates^T
   + lam rq o S^T Q^T (+ D x^T), stored by a bulk copy;
3. the **loads** (one warp): the chunk's k, q, v and scores (not with SWEEP_SCORES) by bulk copies
   into a ring of NUM_STAGES stages, each freed when the chain and the chunk's outputs warpgroup
   are done with it; and the chunk's coef block, which the others read by plain loads, by a bulk
   prefetch into L2 (:data:`COEF_PREFETCH`).

So the chain's step holds one product and a hand-over, and the outputs' products and gate tile run
beside the next chunks' chain, where the twin runs them one after the other on one warpgroup. The
outputs take two warpgroups because a chunk's outputs are a chain of dependent steps (two
products, the gate tile, the store) that keeps one warpgroup longer than the state's step; the
timing probes (:data:`PROBE`) split a chunk's time between the loads, the chain and the outputs.
The planner takes it on ``plan.gla.GLA_SWEEP_LAUNCH``'s group prep row and, with SWEEP_SCORES, on
simple GLA's row (the measurements there and in docs/perf-history.md).

Scope (``plan.delta.gluon_sweep_scope`` and the launch layer's ``_sweep_kernel``; with WY M = 1 and no
skip D x; its planner rows ``plan.delta.GLUON_FORWARD_SPECIALIZED`` and
``GLUON_FORWARD_SPECIALIZED_ONE_PASS``): the single pass (PASS 0) or a phase (PASS 3: chunks
[tc_first, tc_first + tc_count), the state between phases in ``seg_n``, as the twin's), outputs on
(or with WY STORE_U instead, its row ``plan.delta.GLUON_BACKWARD_TWINS["recompute_specialized"]``),
chunk states in the inputs' dtype or none (the hand-over buffer is then held as S [K, BV], a
chunk-state row's tile, and stored from there by one bulk copy a chunk), no checkpoints or
segments; dense or varlen, an initial state or a cache slot (a padding slot's zero outputs), the
final state, SSD's skip D per head or per channel, no gate z. The replay flags are the twin's (the
Triton replay launch runs after this one).
Takes the twin's arguments, so a launch record names either kernel.

CHAINED (the delta rule's single pass over a dense batch; launch/delta.py's chained schedule): the
prep runs beside this kernel as its programmatic dependent, each program raising its (chunk, value
head)'s ``ready_flags`` entry once its stores are out; the load warp waits on a chunk's flag (an
acquire at GPU scope, then a proxy fence, as the bulk copies read through the async proxy what the
prep wrote through the generic one) before it issues the chunk's copies, and the chain and outputs
warpgroups read the chunk's coef rows only after the stage's barrier, rather than ahead of it. A
wait that runs out (:data:`READY_TIMEOUT_NS`) marks the program's state non-finite, so that the
replay launch, after the prep, redoes it.
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .delta_sweep import _end_state, _entering_state, _sequence_bounds

#: Registers a thread of each outputs warpgroup and of the load warp's (setmaxnreg); the chain,
#: the default partition, takes what the kernel's cap leaves (launch.delta.SPECIALIZED_MAXNREG:
#: 128 a thread over 512 threads, so 512 - 2 x 152 - 24 = 184 for the chain).
OUTPUT_REGS = gl.constexpr(152)
#: The same with SWEEP_SCORES, where the scores' product and the state's are in flight together
#: (fewer spill, offline for sm_90; the chain then has 512 - 2 x 160 - 24 = 168).
SCORES_OUTPUT_REGS = gl.constexpr(160)
#: The same with WY (the delta rule): no gate tile, two products and a store a chunk (the chain then
#: has 512 - 2 x 128 - 24 = 232 for the state, K S, U and their operands).
WY_OUTPUT_REGS = gl.constexpr(128)
LOAD_REGS = gl.constexpr(24)
#: A timing probe (``RECURSCAN_SWEEP_PROBE`` when this module is imported; only
#: benchmarks/gpu_ssd_sweep_scaling.py's ``--probe`` sets it): 0 the kernel; 1 the ring alone (both
#: warpgroups wait for each stage and free it, nothing formed or stored); 2 the ring and the chain
#: (the outputs only hand the state buffers back); 3 the ring and the outputs (the chain hands its
#: entering state over unchanged). Probes 1-3 write wrong outputs: for timing only. The scalar
#: decay's form only (the WY form runs whole).
_PROBE = os.environ.get("RECURSCAN_SWEEP_PROBE", "0")
if _PROBE not in ("0", "1", "2", "3"):
    raise ValueError(f"RECURSCAN_SWEEP_PROBE: expected 0, 1, 2 or 3, got {_PROBE!r}")
PROBE = gl.constexpr(int(_PROBE))
#: The load warp asks L2 for each chunk's coef block (2 KB: BT rows of 8 floats) as it issues the
#: chunk's tiles, NUM_STAGES chunks before the outputs and the chain read it (``RECURSCAN_SWEEP_
#: COEF_PREFETCH`` when this module is imported, "1" or "0"; for the A/B on the H200).
_PREFETCH = os.environ.get("RECURSCAN_SWEEP_COEF_PREFETCH", "1")
if _PREFETCH not in ("0", "1"):
    raise ValueError(f"RECURSCAN_SWEEP_COEF_PREFETCH: expected 0 or 1, got {_PREFETCH!r}")
COEF_PREFETCH = gl.constexpr(_PREFETCH == "1")


@gluon.jit
def _prefetch_2kb(ptr):
    """The 2 KB from ``ptr`` (a chunk's coef block: BT = 64 rows of 8 float32) into L2 by one bulk
    prefetch from the warp's first lane: a load warp's, so that the block's readers, NUM_STAGES
    chunks later, wait on L2 rather than memory."""
    gl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %l; mov.u32 %l, %laneid; setp.eq.u32 %p, %l, 0; "
        "@%p cp.async.bulk.prefetch.L2.global [$1], 2048; mov.u32 $0, 0; }",
        "=r,l", [ptr], dtype=gl.int32, is_pure=False, pack=1)


#: CHAINED: how long the load warp waits for one chunk's ready flag (ns of the global timer) before
#: it gives the chunk up: the prep runs beside the sweep only where the driver launches it as the
#: sweep's programmatic dependent, which CUDA allows but does not promise (a profiler that
#: serialises kernels, another stream holding the SMs); the program then finishes on whatever it
#: read, marks its state for the replay launch, which redoes it once the prep is done, and no later
#: chunk of it waits. A wait in a run that keeps the schedule takes microseconds.
READY_TIMEOUT_NS = gl.constexpr(100_000_000)


@gluon.jit
def _ready_flag(ptr):
    """The int32 at ``ptr``, read with acquire semantics at GPU scope: the prep's stores before its
    release of the flag are visible to this thread's later reads, and (through its arrivals on the
    ring's barriers) to the other partitions' after their waits."""
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _global_ns():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _await_ready(ptr, late):
    """Wait (unless ``late``) for the ready flag at ``ptr`` (a chunk's, set by the chained prep), at
    most READY_TIMEOUT_NS; then a proxy fence, as the bulk copies read through the async proxy what
    the prep wrote through the generic one. Returns ``late``, 1 once a wait ran out."""
    if late == 0:
        t0 = _global_ns()
        flag = _ready_flag(ptr)
        while (flag == 0) & (late == 0):
            flag = _ready_flag(ptr)
            if _global_ns() - t0 > READY_TIMEOUT_NS:
                late = late * 0 + 1
        gl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
    return late


@gluon.jit
def _chain_coefficients(coef, bos, c, i_n, i_hv, o_i, L, HV: gl.constexpr, BT: gl.constexpr, CW: gl.constexpr,
                        WY: gl.constexpr):
    """Chunk c's gam rk (along V^T's or U^T's columns), lam_last and, with WY, lam rk (coef columns
    2, 3, 0) in ``o_i``'s layout; without WY lam rk is gam rk's value, unread."""
    p_coef = coef + (((bos + c * BT) // BT + i_n) * HV + i_hv) * (BT * CW)
    m_i = c * BT + o_i < L
    gam_rk = gl.load(p_coef + o_i * CW + 2, mask=m_i, other=0.0)
    lam_last = gl.load(p_coef + 3)
    lam_rk = gam_rk
    if WY:
        lam_rk = gl.load(p_coef + o_i * CW, mask=m_i, other=0.0)
    return gam_rk, lam_last, lam_rk


@gluon.jit
def _handover_barriers(NUM_STAGES: gl.constexpr, STAGE_READERS: gl.constexpr = 2, HANDED_READERS: gl.constexpr = 1):
    """The barriers of a warp-specialised kernel (both sweeps, and the dg launch's form): ``ready``
    and ``empty`` a ring stage each (a stage is empty once its STAGE_READERS arrived: in the sweeps
    the chain and the chunk's outputs warpgroup), ``s_ready`` and ``s_empty`` a hand-over buffer
    each, two of them (in the sweeps one an outputs warpgroup, freed by it; in the dg launch an
    item's q and k, freed by both heads warpgroups: HANDED_READERS), initialised and fenced."""
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    s_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    s_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=STAGE_READERS)
    for i in gl.static_range(2):
        mbarrier.init(s_ready.index(i), count=1)
        mbarrier.init(s_empty.index(i), count=HANDED_READERS)
    fence_async_shared()
    return ready, empty, s_ready, s_empty


@gluon.jit
def _chain(p, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
           PASS: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_H0: gl.constexpr, USE_CACHE: gl.constexpr,
           STORE_FINAL: gl.constexpr, HAS_D: gl.constexpr, D_PER_CHANNEL: gl.constexpr,
           SWEEP_SCORES: gl.constexpr, STORE_CHUNK_STATES: gl.constexpr, WY: gl.constexpr, OUTPUTS: gl.constexpr,
           STORE_U: gl.constexpr, CHAINED: gl.constexpr):
    """The default partition: the state over the program's chunks, each chunk's entering state
    handed to the outputs (with STORE_CHUNK_STATES also to its chunk-state row, by a bulk store from
    the same buffer; with STORE_U the stores' warpgroup issues that store), with WY also the chunk's
    U^T (into the outputs warpgroup's staging buffer) and with STORE_U lam rk o K S (into a buffer
    beside it), then the final state (or cache slot) and, with outputs, the replay flag."""
    (k_s, q_s, v_s, a_s, s_s, g_s, w_s, ready, empty, s_ready, s_empty, u_empty, k_desc, q_desc, v_desc, a_desc,
     w_desc, o_desc, cs_desc, coef, D, h0, ht, state, seg_n, replay_flags, pid, bos, L, c_lo, first_phase, ends,
     flags, n_run, n_chunks, i_n, i_hv, i_v, slot, pad, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, col_qk, col_v, col_w,
     cs0, n_cs_rows, u_desc, ks_desc, ks_s, ready_flags, late_s) = p
    DT: gl.constexpr = k_s.dtype
    mmaK: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, K, 16])
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    aK: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mmaK, k_width=2)
    a64: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma64, k_width=2)
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
    CW: gl.constexpr = 4 if WY else 8  # coef's floats a row (the delta prep's, the group prep's)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    p_h = (i_n * HV + i_hv) * (K * V)  # the program's state between phases in seg_n
    S_b = _entering_state(h0, state, seg_n, slot, pad, first_phase, p_h, i_n, 0, 1, i_hv, i_v, s0_n, s0_h, s0_k, s0_v,
                          blk, HV, K, V, BV, PASS, USE_CACHE, HAS_H0)
    S_t = gl.convert_layout(S_b, mmaK)
    o_i = gl.arange(0, BT, layout=col64)
    for j in range(n_run):
        s = j % NUM_STAGES
        b = j % 2
        # gam rk along V^T's (or U^T's) columns, lam_last, with WY lam rk (coef columns 2, 3, 0),
        # in the layouts they are used in
        c = c_lo + j
        if not CHAINED:  # issued before the waits, which cover their latency
            gam_rk, lam_last, lam_rk = _chain_coefficients(coef, bos, c, i_n, i_hv, o_i, L, HV, BT, CW, WY)
        S_d = S_t.to(DT)
        if PROBE != 1:
            # The state entering chunk j, to the outputs (the buffer they freed two chunks ago).
            mbarrier.wait(s_empty.index(b), ((j // 2) & 1) ^ 1)
            if STORE_U:
                # the recompute: the buffer holds S [K, BV], a chunk-state row's tile, which the
                # stores' warpgroup stores (and frees once drained) with the chunk's U and K S
                s_s.index(b).permute((1, 0)).store(S_d)
                fence_async_shared()
            elif STORE_CHUNK_STATES:
                # and to its chunk-state row: the buffer holds S [K, BV], a row's tile; its store
                # two chunks ago has drained (one bulk store a chunk, so at most one pending)
                tma.store_wait(pendings=1)
                s_s.index(b).permute((1, 0)).store(S_t.to(DT))
                fence_async_shared()
                gl.thread_barrier()
                cs = cs0 + c
                cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)  # past the descriptor: not stored
                tma.async_copy_shared_to_global(cs_desc, [(cs * HV + i_hv).to(gl.int32) * K, i_v * BV], s_s.index(b))
            else:
                s_s.index(b).store(S_d)
                fence_async_shared()
            if not WY:  # with WY once U^T is in too (below)
                mbarrier.arrive(s_ready.index(b), count=1)
        mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
        if CHAINED:  # the prep writes them as the sweep runs: read once the load warp saw them ready
            gam_rk, lam_last, lam_rk = _chain_coefficients(coef, bos, c, i_n, i_hv, o_i, L, HV, BT, CW, WY)
        if WY:
            # Group 1: K S and V^T wy^T; group 2: U^T = V^T wy^T - (lam rk o K S) wy^T (the twin's).
            S_a = gl.convert_layout(S_d, a64)
            KSt = warpgroup_mma(S_a, k_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
            Ut = warpgroup_mma(v_s.index(s).permute((1, 0)), w_s.index(s).permute((1, 0)), zero64, use_acc=False,
                               is_async=True)
            KSt, Ut = warpgroup_mma_wait(num_outstanding=0, deps=(KSt, Ut))
            KSt = lam_rk[None, :] * KSt
            Ut = warpgroup_mma(gl.convert_layout((-KSt).to(DT), a64), w_s.index(s).permute((1, 0)), Ut,
                               is_async=True)
            # U^T (and with STORE_U lam rk o K S, while the product runs) to the outputs warpgroup,
            # into its buffers once their last stores drained
            if STORE_U:
                mbarrier.wait(u_empty.index(b), ((j // 2) & 1) ^ 1)
                ks_s.index(b).permute((1, 0)).store(KSt.to(DT))
            Ut = warpgroup_mma_wait(num_outstanding=0, deps=(Ut,))
            if not STORE_U:
                mbarrier.wait(u_empty.index(b), ((j // 2) & 1) ^ 1)
            g_s.index(b).permute((1, 0)).store(Ut.to(DT))
            fence_async_shared()
            mbarrier.arrive(s_ready.index(b), count=1)
            # Group 3: S^T <- lam_last S^T + (U^T o gam rk) K.
            U_g = gl.convert_layout((Ut * gam_rk[None, :]).to(DT), aK)
            S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last, is_async=True)
            S_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t,))
        elif PROBE == 0 or PROBE == 2:
            # The next state: S^T <- lam_last S^T + (V^T o gam) K.
            Vt = v_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)  # [BV, BT]
            U_g = gl.convert_layout((Vt * gam_rk[None, :]).to(DT), aK)
            S_t = warpgroup_mma(U_g, k_s.index(s), S_t * lam_last, is_async=True)
            S_t = warpgroup_mma_wait(num_outstanding=0, deps=(S_t,))
        mbarrier.arrive(empty.index(s), count=1)
    if STORE_CHUNK_STATES and not STORE_U:
        tma.store_wait(pendings=0)
    if CHAINED:  # a wait ran out (the load warp's mark, behind its arrivals): the replay launch redoes it all
        late = gl.max(late_s.load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)
        S_t = gl.where(late != 0, float("nan"), S_t)

    # the replay flag (the last phase's programs, where phased), the final state or cache slot, or
    # the next phase's entering state
    _end_state(S_t, flags, ends, pad, replay_flags, pid, state, slot, s0_n, s0_h, s0_k, s0_v, ht, ht_n, ht_h, seg_n,
               p_h, i_n, i_hv, i_v, mmaK, V, BV, K, OUTPUTS, USE_CACHE, STORE_FINAL, PASS)


@gluon.jit
def _gate_coefficients(coef, bos, c, i_n, i_hv, o_i, o_j, HV: gl.constexpr, BT: gl.constexpr,
                       SWEEP_SCORES: gl.constexpr):
    """Chunk c's lam rq, gc and segments along the gate tile's columns (``o_i``'s layout) and gc,
    segments and column factors along its rows (``o_j``'s), read from the group prep's coef rows in
    those layouts (the values of :func:`_row_coefficients`, with no layout change: each is a trip
    through shared memory and a barrier). Unmasked: the group prep writes every row of a chunk's
    slot, and a row past the sequence's end reaches only outputs past it (the gate tile's causal
    mask keeps it from the rows before), which the bulk store leaves out. SWEEP_SCORES: the column
    factors with the scale (column 7), as the Triton sweep's ``_gated_scores``."""
    p_coef = coef + (((bos + c * BT) // BT + i_n) * HV + i_hv) * (BT * 8)
    lam_rq = gl.load(p_coef + o_i * 8 + 1)
    gc_i = gl.load(p_coef + o_i * 8 + 4)
    sg_i = gl.load(p_coef + o_i * 8 + 5)
    gc_j = gl.load(p_coef + o_j * 8 + 4)
    sg_j = gl.load(p_coef + o_j * 8 + 5)
    cf_j = gl.load(p_coef + o_j * 8 + (7 if SWEEP_SCORES else 6))
    return lam_rq, gc_i, sg_i, gc_j, sg_j, cf_j


@gluon.jit
def _outputs(p, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
             NUM_STAGES: gl.constexpr, HAS_H0: gl.constexpr, USE_CACHE: gl.constexpr,
             STORE_FINAL: gl.constexpr, HAS_D: gl.constexpr, D_PER_CHANNEL: gl.constexpr, SWEEP_SCORES: gl.constexpr,
             STORE_CHUNK_STATES: gl.constexpr, PART: gl.constexpr, WY: gl.constexpr, OUTPUTS: gl.constexpr,
             CHAINED: gl.constexpr):
    """A worker warpgroup: the outputs of every other chunk (those with j % 2 == PART; the other
    warpgroup takes the rest) from the state the chain handed over in buffer PART (with WY also
    U^T, in the outputs' staging buffer PART). Two of them, as one warpgroup's chunk is a chain of
    dependent steps (two products, the gate tile, the store) that leaves its warps idle most of the
    time. Without outputs (the backward's recompute, STORE_U): the stores of the chunk state, U and
    lam o K S."""
    (k_s, q_s, v_s, a_s, s_s, g_s, w_s, ready, empty, s_ready, s_empty, u_empty, k_desc, q_desc, v_desc, a_desc,
     w_desc, o_desc, cs_desc, coef, D, h0, ht, state, seg_n, replay_flags, pid, bos, L, c_lo, first_phase, ends,
     flags, n_run, n_chunks, i_n, i_hv, i_v, slot, pad, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, col_qk, col_v, col_w,
     cs0, n_cs_rows, u_desc, ks_desc, ks_s, ready_flags, late_s) = p
    DT: gl.constexpr = k_s.dtype
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    row64: gl.constexpr = gl.SliceLayout(1, mma64)
    blk: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
    o_j = gl.arange(0, BT, layout=row64)
    o_i = gl.arange(0, BT, layout=col64)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    if HAS_D:  # D per head, or per value column ([BV, 1] along the tile's rows)
        if D_PER_CHANNEL:
            o_vd = i_v * BV + gl.arange(0, BV, layout=row64)
            d_skip = gl.load(D + i_hv * V + o_vd).to(gl.float32)[:, None]
        else:
            d_skip = gl.load(D + i_hv).to(gl.float32)
    g_s = g_s.index(PART)  # the gated scores (with WY U^T), then the outputs' staging for their bulk store
    b = PART
    if not OUTPUTS:
        _stores_of_recompute(p, HV, BT, PART)
    elif WY:
        _outputs_of_wy(p, HV, BT, BV, NUM_STAGES, STORE_CHUNK_STATES, PART, CHAINED)
    else:
        for j in range(PART, n_run, 2):
            s = j % NUM_STAGES
            c = c_lo + j
            # issued before the waits, which cover their latency
            lam_rq, gc_i, sg_i, gc_j, sg_j, cf_j = _gate_coefficients(coef, bos, c, i_n, i_hv, o_i, o_j, HV, BT,
                                                                      SWEEP_SCORES)
            mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
            if PROBE == 1:
                mbarrier.arrive(empty.index(s), count=1)
            elif PROBE == 2:
                mbarrier.wait(s_ready.index(b), (j // 2) & 1)
                mbarrier.arrive(s_empty.index(b), count=1)
                mbarrier.arrive(empty.index(s), count=1)
            else:
                if SWEEP_SCORES:  # K Q^T [j, i], which needs no state: issued before the chain's hand-over
                    St = warpgroup_mma(k_s.index(s), q_s.index(s).permute((1, 0)), zero64, use_acc=False,
                                       is_async=True)
                mbarrier.wait(s_ready.index(b), (j // 2) & 1)
                if STORE_CHUNK_STATES:  # the buffer holds S [K, BV]: S^T is its transposed view
                    S_h = s_s.index(b).permute((1, 0))
                else:
                    S_h = s_s.index(b)
                QSt = warpgroup_mma(S_h, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
                # aqk^T [j, i] = G_ij c_j scores_ij while the product runs (the twin's gate tile).
                if SWEEP_SCORES:
                    St = warpgroup_mma_wait(num_outstanding=1, deps=(St,))
                else:
                    St = a_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)
                same = sg_j[:, None] == sg_i[None, :]
                if SWEEP_SCORES:  # a bad key's score past a reset too (the Triton sweep's _gated_scores)
                    same |= St * 0.0 != 0.0
                keep = (o_j[:, None] <= o_i[None, :]) & same
                At = gl.where(keep, gl.exp2(gc_i[None, :] - gc_j[:, None]) * cf_j[:, None] * St, 0.0)
                tma.store_wait(pendings=0)  # the last chunk's outputs out of g_s
                g_s.permute((1, 0)).store(At.to(DT))
                fence_async_shared()
                gl.thread_barrier()
                QSt = warpgroup_mma_wait(num_outstanding=0, deps=(QSt,))
                mbarrier.arrive(s_empty.index(b), count=1)
                O_t = warpgroup_mma(v_s.index(s).permute((1, 0)), g_s.permute((1, 0)), lam_rq[None, :] * QSt,
                                    is_async=True)
                if HAS_D:  # Mamba2's skip D x (v holds x)
                    Vt = v_s.index(s).permute((1, 0)).load(mma64).to(gl.float32)
                O_t = warpgroup_mma_wait(num_outstanding=0, deps=(O_t,))
                mbarrier.arrive(empty.index(s), count=1)
                if HAS_D:
                    O_t += d_skip * Vt
                gl.thread_barrier()  # every warp's reads of g_s by the product done
                g_s.permute((1, 0)).store(O_t.to(DT))
                fence_async_shared()
                gl.thread_barrier()
                tma.async_copy_shared_to_global(o_desc, [c * BT, i_v * BV], g_s)
    if OUTPUTS:
        if pad:  # a padding slot: zero outputs over the program's chunks, half of them here
            g_s.store(gl.zeros([BT, BV], DT, layout=blk))
            fence_async_shared()
            gl.thread_barrier()
            for j in range(PART, n_chunks, 2):
                tma.async_copy_shared_to_global(o_desc, [(c_lo + j) * BT, i_v * BV], g_s)
    tma.store_wait(pendings=0)


@gluon.jit
def _outputs_of_wy(p, HV: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr, NUM_STAGES: gl.constexpr,
                   STORE_CHUNK_STATES: gl.constexpr, PART: gl.constexpr, CHAINED: gl.constexpr):
    """:func:`_outputs` with WY: per chunk O^T = U^T aqk^T + lam rq o (S^T Q^T) (the twin's), U^T and
    S^T as the chain handed them over; the staging buffer (U^T's) is given back once the outputs'
    bulk store from it drained, as the chain writes the next U^T there."""
    (k_s, q_s, v_s, a_s, s_s, g_s, w_s, ready, empty, s_ready, s_empty, u_empty, k_desc, q_desc, v_desc, a_desc,
     w_desc, o_desc, cs_desc, coef, D, h0, ht, state, seg_n, replay_flags, pid, bos, L, c_lo, first_phase, ends,
     flags, n_run, n_chunks, i_n, i_hv, i_v, slot, pad, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, col_qk, col_v, col_w,
     cs0, n_cs_rows, u_desc, ks_desc, ks_s, ready_flags, late_s) = p
    DT: gl.constexpr = k_s.dtype
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    col64: gl.constexpr = gl.SliceLayout(0, mma64)
    o_i = gl.arange(0, BT, layout=col64)
    zero64 = gl.zeros([BV, BT], gl.float32, layout=mma64)
    u_s = g_s.index(PART)
    b = PART
    for j in range(PART, n_run, 2):
        s = j % NUM_STAGES
        c = c_lo + j
        p_coef = coef + (((bos + c * BT) // BT + i_n) * HV + i_hv) * (BT * 4)
        if not CHAINED:  # before the waits
            lam_rq = gl.load(p_coef + o_i * 4 + 1, mask=c * BT + o_i < L, other=0.0)
        mbarrier.wait(ready.index(s), (j // NUM_STAGES) & 1)
        if CHAINED:  # written by the prep as the sweep runs: once the load warp saw the chunk ready
            lam_rq = gl.load(p_coef + o_i * 4 + 1, mask=c * BT + o_i < L, other=0.0)
        mbarrier.wait(s_ready.index(b), (j // 2) & 1)
        if STORE_CHUNK_STATES:  # the buffer holds S [K, BV]: S^T is its transposed view
            S_h = s_s.index(b).permute((1, 0))
        else:
            S_h = s_s.index(b)
        QSt = warpgroup_mma(S_h, q_s.index(s).permute((1, 0)), zero64, use_acc=False, is_async=True)
        QSt = warpgroup_mma_wait(num_outstanding=0, deps=(QSt,))
        mbarrier.arrive(s_empty.index(b), count=1)
        O_t = warpgroup_mma(u_s.permute((1, 0)), a_s.index(s).permute((1, 0)), lam_rq[None, :] * QSt,
                            is_async=True)
        O_t = warpgroup_mma_wait(num_outstanding=0, deps=(O_t,))
        mbarrier.arrive(empty.index(s), count=1)
        gl.thread_barrier()  # every warp's reads of U^T by the product done
        u_s.permute((1, 0)).store(O_t.to(DT))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [c * BT, i_v * BV], u_s)
        tma.store_wait(pendings=0)
        mbarrier.arrive(u_empty.index(b), count=1)


@gluon.jit
def _stores_of_recompute(p, HV: gl.constexpr, BT: gl.constexpr, PART: gl.constexpr):
    """:func:`_outputs` without outputs (the backward's recompute, STORE_U): a chunk's entering
    state, U and lam o K S, as the chain wrote them into this warpgroup's buffers, to its
    chunk-state row and its rows of ``u_out`` and ``ks_out`` by bulk stores; the buffers given
    back once the stores drained."""
    (k_s, q_s, v_s, a_s, s_s, g_s, w_s, ready, empty, s_ready, s_empty, u_empty, k_desc, q_desc, v_desc, a_desc,
     w_desc, o_desc, cs_desc, coef, D, h0, ht, state, seg_n, replay_flags, pid, bos, L, c_lo, first_phase, ends,
     flags, n_run, n_chunks, i_n, i_hv, i_v, slot, pad, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, col_qk, col_v, col_w,
     cs0, n_cs_rows, u_desc, ks_desc, ks_s, ready_flags, late_s) = p
    K: gl.constexpr = k_s.shape[2]
    BV: gl.constexpr = v_s.shape[2]
    u_s = g_s.index(PART)
    k_b = ks_s.index(PART)
    b = PART
    for j in range(PART, n_run, 2):
        c = c_lo + j
        cs = cs0 + c
        cs = gl.where((cs >= 0) & (cs < n_cs_rows), cs, n_cs_rows)  # past the descriptor: not stored
        mbarrier.wait(s_ready.index(b), (j // 2) & 1)
        tma.async_copy_shared_to_global(cs_desc, [(cs * HV + i_hv).to(gl.int32) * K, i_v * BV], s_s.index(b))
        tma.async_copy_shared_to_global(u_desc, [c * BT, col_v], u_s)
        tma.async_copy_shared_to_global(ks_desc, [c * BT, col_v], k_b)
        tma.store_wait(pendings=0)
        mbarrier.arrive(s_empty.index(b), count=1)
        mbarrier.arrive(u_empty.index(b), count=1)


@gluon.jit
def _prefetch_1kb(ptr):
    """:func:`_prefetch_2kb` for 1 KB (the delta prep's coef block: BT = 64 rows of 4 float32)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %l; mov.u32 %l, %laneid; setp.eq.u32 %p, %l, 0; "
        "@%p cp.async.bulk.prefetch.L2.global [$1], 1024; mov.u32 $0, 0; }",
        "=r,l", [ptr], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _loads(p, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
           NUM_STAGES: gl.constexpr, HAS_H0: gl.constexpr, USE_CACHE: gl.constexpr,
           STORE_FINAL: gl.constexpr, HAS_D: gl.constexpr, D_PER_CHANNEL: gl.constexpr,
           SWEEP_SCORES: gl.constexpr, WY: gl.constexpr, OUTPUTS: gl.constexpr, CHAINED: gl.constexpr):
    """A worker warp: the chunks' tiles by bulk copies, a stage once its readers freed it (the
    scores' tile only where the prep formed them; with WY also wy's; q's and the scores' only with
    outputs). CHAINED: a chunk's copies once its ready flag is up (:func:`_await_ready`); a wait
    that ran out is marked in ``late_s`` before the stage's arrival, and no later chunk waits."""
    (k_s, q_s, v_s, a_s, s_s, g_s, w_s, ready, empty, s_ready, s_empty, u_empty, k_desc, q_desc, v_desc, a_desc,
     w_desc, o_desc, cs_desc, coef, D, h0, ht, state, seg_n, replay_flags, pid, bos, L, c_lo, first_phase, ends,
     flags, n_run, n_chunks, i_n, i_hv, i_v, slot, pad, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, col_qk, col_v, col_w,
     cs0, n_cs_rows, u_desc, ks_desc, ks_s, ready_flags, late_s) = p
    nbytes: gl.constexpr = (k_desc.block_type.nbytes + v_desc.block_type.nbytes
                            + (q_desc.block_type.nbytes if OUTPUTS else 0)
                            + (a_desc.block_type.nbytes if OUTPUTS and not SWEEP_SCORES else 0)
                            + (w_desc.block_type.nbytes if WY else 0))
    CW: gl.constexpr = 4 if WY else 8
    gl.static_assert(BT == 64, "a chunk's coef block is the 1 KB (WY) or 2 KB prefetched")
    p_coef = coef + ((bos // BT + i_n) * HV + i_hv) * (BT * CW)  # chunk c's block: + c HV BT CW (its slot)
    p_ready = ready_flags + (bos // BT + i_n) * HV + i_hv  # chunk c's flag: + c HV (its slot, as coef's)
    late = n_run * 0
    for j in range(n_run):
        s = j % NUM_STAGES
        bar = ready.index(s)
        mbarrier.wait(empty.index(s), ((j // NUM_STAGES) & 1) ^ 1)
        if CHAINED:
            late = _await_ready(p_ready + (c_lo + j) * HV, late)
            if late != 0:
                late_s.store(gl.full([32], 1, gl.int32, layout=gl.BlockedLayout([1], [32], [1], [0])))
        mbarrier.expect(bar, nbytes)
        r = (c_lo + j) * BT
        tma.async_copy_global_to_shared(k_desc, [r, col_qk], bar, k_s.index(s))
        tma.async_copy_global_to_shared(v_desc, [r, col_v], bar, v_s.index(s))
        if OUTPUTS:
            tma.async_copy_global_to_shared(q_desc, [r, col_qk], bar, q_s.index(s))
            if not SWEEP_SCORES:
                tma.async_copy_global_to_shared(a_desc, [r, col_w], bar, a_s.index(s))
        if WY:
            tma.async_copy_global_to_shared(w_desc, [r, col_w], bar, w_s.index(s))
        if COEF_PREFETCH:
            if WY:
                _prefetch_1kb(p_coef + (c_lo + j) * (HV * BT * 4))
            else:
                _prefetch_2kb(p_coef + (c_lo + j) * (HV * BT * 8))


@gluon.jit
def gluon_gla_sweep_specialized_kernel(
    q, k, v, wy, aqk, coef, o,
    h0, ht, state, state_indices, chunk_states, cu_seqlens, chunk_offsets, sequence_order,
    seg_n, seg_m, n_seg, seg_chunks, tc_first, tc_count, trigger_dependents, T,
    s0_n, s0_h, s0_k, s0_v, n_slots, n_cs_rows, replay_flags, u_out, ks_out, checkpoints, n_ckpt, D, z, dl,
    o_st, o_sh, ht_n, ht_h, ready_flags,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, M: gl.constexpr,
    BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr,
    IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr,
    STORE_FINAL: gl.constexpr, USE_CACHE: gl.constexpr, STORE_CHUNK_STATES: gl.constexpr,
    DOT_PRECISION: gl.constexpr, NUM_STAGES: gl.constexpr, DT: gl.constexpr, PASS: gl.constexpr = 0,
    V_PRODUCT: gl.constexpr = True, TMA_STORE: gl.constexpr = False, PDL: gl.constexpr = False,
    REPLAY: gl.constexpr = False, OUTPUTS: gl.constexpr = True, STORE_U: gl.constexpr = False,
    CKPT_CHUNKS: gl.constexpr = 0, WY: gl.constexpr = True, HAS_D: gl.constexpr = False,
    D_PER_CHANNEL: gl.constexpr = False, HAS_Z: gl.constexpr = False, KEY_DECAY: gl.constexpr = False,
    GATE_SCORES: gl.constexpr = False, CALM_GATES: gl.constexpr = False, SWEEP_SCORES: gl.constexpr = False,
    CHAINED: gl.constexpr = False,
):
    """Grid (N * HV * V / BV,) as the twin's PASS 0 and 3: program -> (sequence, value head, value
    block of BV = 64), the block fastest; the twin's arguments (those of its other passes and forms
    unread). Per chunk, with lam rq, gam rk, lam_last and the gates from the group prep's ``coef``::

        O^T  = lam rq o (S^T Q^T) + V^T aqk^T  (+ D x^T with HAS_D),  aqk^T[j, i] = G_ij c_j scores_ij
        S^T <- lam_last S^T + (V^T o gam rk) K

    or with WY (the delta prep's wy, aqk and coef rows lam rk, lam rq, gam rk, lam_last)::

        U^T  = V^T wy^T - (lam rk o S^T K^T) wy^T
        O^T  = lam rq o (S^T Q^T) + U^T aqk^T
        S^T <- lam_last S^T + (U^T o gam rk) K

    SWEEP_SCORES: the outputs form scores = K Q^T from the ring's k and q tiles (``aqk`` unread)
    and gate them with the column factors that carry the scale (the Triton sweep's form). The
    chain, the outputs and the loads on partitions of their own (module docstring); launched with
    ``maxnreg`` (launch.delta) for the three warpgroups' registers."""
    gl.static_assert(BV == 64, "64 value columns a program")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    gl.static_assert(M == 1, "M = 1")
    gl.static_assert(WY != GATE_SCORES, "the delta prep's WY step, or the group prep's scores")
    gl.static_assert(OUTPUTS != STORE_U and (WY or OUTPUTS) and (STORE_CHUNK_STATES or not STORE_U),
                     "outputs, or with WY instead the chunk states, U and lam o K S stored (STORE_U: the "
                     "backward's recompute)")
    gl.static_assert(not (WY and (SWEEP_SCORES or HAS_D or PROBE != 0)),
                     "the delta rule: no scores formed here, no skip D x, no timing probe")
    gl.static_assert(not (KEY_DECAY or HAS_Z or CALM_GATES or REPLAY), "a scalar decay, no gate z")
    gl.static_assert((PASS == 0 or PASS == 3) and CKPT_CHUNKS == 0, "the single pass or a phase, no checkpoints")
    gl.static_assert(not CHAINED or (WY and PASS == 0 and OUTPUTS and not IS_VARLEN),
                     "the chained schedule: the delta rule's single pass over a dense batch, with outputs")
    if STORE_CHUNK_STATES:
        gl.static_assert(chunk_states.dtype.element_ty == DT, "chunk states in the inputs' dtype (the hand-over's)")
    if PDL:
        if trigger_dependents != 0:  # the next phase's prep may start on the SMs this phase leaves free
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_n = (pid // (NV * HV)).to(gl.int64)
    if IS_VARLEN:  # longest sequences first (ranked by the prep)
        i_n = gl.load(sequence_order + i_n).to(gl.int64)
    i_h = i_hv // (HV // H)
    bos, eos = _sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    L = eos - bos
    n_total = ((L + BT - 1) // BT).to(gl.int32)
    # Chunks [c_lo, c_hi) of the sequence; ``first_phase``: from its initial state; ``ends``: the
    # program ends the sequence (final state, cache slot); ``flags``: it raises its replay flag.
    first_phase = True
    ends = True
    flags = True
    if PASS == 3:
        c_lo = n_total * 0 + tc_first
        c_hi = gl.minimum(c_lo + tc_count, n_total)
        first_phase = c_lo == 0
        ends = c_hi == n_total
        flags = ends
    else:
        c_lo = n_total * 0
        c_hi = n_total
    n_chunks = gl.maximum(c_hi - c_lo, 0)
    pad = False
    slot = i_n * 0
    n_run = n_chunks
    if USE_CACHE:  # a slot outside [0, n_slots): padding, zero outputs, no state access
        slot = gl.load(state_indices + i_n).to(gl.int64)
        pad = (slot < 0) | (slot >= n_slots)
        n_run = gl.where(pad, 0, n_chunks)

    # Descriptors over this sequence's rows: a tile past its end reads zeros, a store stops there.
    rows = gl.maximum(L, 1).to(gl.int32)
    l_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], DT)
    l_tv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], DT)
    l_tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], DT)
    l_vk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BV, K], DT)
    A_DT: gl.constexpr = aqk.dtype.element_ty
    l_at: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], A_DT)
    # With STORE_U (no outputs): U and lam o K S in v's layout, and no query tiles (k's stand in, unread).
    k_desc = tma.make_tensor_descriptor(k + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    if STORE_U:
        q_desc = k_desc
    else:
        q_desc = tma.make_tensor_descriptor(q + bos * (H * K), [rows, H * K], [H * K, 1], [BT, K], l_qk)
    v_desc = tma.make_tensor_descriptor(v + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
    if STORE_U:
        u_desc = tma.make_tensor_descriptor(u_out + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
        ks_desc = tma.make_tensor_descriptor(ks_out + bos * (HV * V), [rows, HV * V], [HV * V, 1], [BT, BV], l_tv)
        o_desc = u_desc
    else:
        o_desc = tma.make_tensor_descriptor(o + bos * o_st + i_hv * o_sh, [rows, V], [o_st, 1], [BT, BV], l_tv)
        u_desc = o_desc  # unread
        ks_desc = o_desc

    k_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    if STORE_U:
        q_s = k_s
    else:
        q_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, K], l_qk)
    v_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BV], l_tv)
    # aqk's tiles: a query/key head's scores (the group prep's), or with WY a value head's [BT, BT]
    # rows of the delta prep's, beside its wy tiles
    AH: gl.constexpr = HV if WY else H
    if SWEEP_SCORES or not OUTPUTS:  # no scores' ring: k's stands in for it in the partitions' arguments, unread
        a_desc = k_desc
        a_s = k_s
    else:
        a_desc = tma.make_tensor_descriptor(aqk + bos * (AH * BT), [rows, AH * BT], [AH * BT, 1], [BT, BT], l_at)
        a_s = gl.allocate_shared_memory(A_DT, [NUM_STAGES, BT, BT], l_at)
    if WY:
        w_desc = tma.make_tensor_descriptor(wy + bos * (HV * BT), [rows, HV * BT], [HV * BT, 1], [BT, BT], l_tt)
        w_s = gl.allocate_shared_memory(DT, [NUM_STAGES, BT, BT], l_tt)
    else:  # unread
        w_desc = a_desc
        w_s = a_s
    # the states handed to the outputs: S^T [BV, K], or with STORE_CHUNK_STATES S [K, BV], a
    # chunk-state row's tile (chunk_states [rows, HV, K, V] seen as [rows * HV * K, V])
    if STORE_CHUNK_STATES:
        l_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], DT)
        s_s = gl.allocate_shared_memory(DT, [2, K, BV], l_kv)
        # Chunk-state rows outside [0, n_cs_rows) (a wrong chunk_offsets entry) are moved just past it.
        cs_desc = tma.make_tensor_descriptor(chunk_states, [n_cs_rows * (HV * K), V], [V, 1], [K, BV], l_kv)
        if IS_VARLEN:
            cs0 = gl.load(chunk_offsets + i_n).to(gl.int64)
        else:
            cs0 = i_n * ((T + BT - 1) // BT)
    else:
        s_s = gl.allocate_shared_memory(DT, [2, BV, K], l_vk)
        cs_desc = o_desc  # unread
        cs0 = i_n * 0
    # each outputs warpgroup's gated scores (with WY the chunk's U^T), the outputs' operand, then its
    # outputs' staging
    gl.static_assert(BT == BV, "the gated scores' buffer stages the outputs")
    g_s = gl.allocate_shared_memory(DT, [2, BT, BT], l_tt)
    if STORE_U:  # each outputs warpgroup's lam o K S, beside its U^T
        ks_s = gl.allocate_shared_memory(DT, [2, BT, BV], l_tv)
    else:  # unread
        ks_s = g_s
    # a ring stage is read by the chain and (with outputs) the chunk's outputs warpgroup
    ready, empty, s_ready, s_empty = _handover_barriers(NUM_STAGES, STAGE_READERS=2 if OUTPUTS else 1)
    if WY:  # U^T's buffers, each free again once its outputs' store drained
        u_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(u_empty.index(i), count=1)
        fence_async_shared()
    else:  # unread
        u_empty = s_empty
    if CHAINED:  # set by the load warp once a ready flag's wait ran out (zero to begin with)
        late_s = gl.allocate_shared_memory(gl.int32, [32], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        late_s.store(gl.zeros([32], gl.int32, layout=gl.BlockedLayout([1], [32], [4], [0])))
        gl.thread_barrier()
    else:  # unread
        late_s = s_empty

    p = (k_s, q_s, v_s, a_s, s_s, g_s, w_s, ready, empty, s_ready, s_empty, u_empty, k_desc, q_desc, v_desc, a_desc,
         w_desc, o_desc, cs_desc, coef, D, h0, ht, state, seg_n, replay_flags, pid, bos, L, c_lo, first_phase, ends,
         flags, n_run, n_chunks, i_n, i_hv, i_v, slot, pad, s0_n, s0_h, s0_k, s0_v, ht_n, ht_h, i_h * K,
         i_hv * V + i_v * BV, (i_hv if WY else i_h) * BT, cs0, n_cs_rows, u_desc, ks_desc, ks_s, ready_flags, late_s)
    OUT_REGS: gl.constexpr = WY_OUTPUT_REGS if WY else (SCORES_OUTPUT_REGS if SWEEP_SCORES else OUTPUT_REGS)
    # Each partition's arguments written out in the call: a tuple named first would carry the
    # constexprs as values (Triton 3.6).
    gl.warp_specialize([
        (_chain, (p, HV, K, V, BT, BV, PASS, NUM_STAGES, HAS_H0, USE_CACHE, STORE_FINAL, HAS_D, D_PER_CHANNEL,
                  SWEEP_SCORES, STORE_CHUNK_STATES, WY, OUTPUTS, STORE_U, CHAINED)),
        (_outputs, (p, HV, K, V, BT, BV, NUM_STAGES, HAS_H0, USE_CACHE, STORE_FINAL, HAS_D, D_PER_CHANNEL,
                    SWEEP_SCORES, STORE_CHUNK_STATES, 0, WY, OUTPUTS, CHAINED)),
        (_outputs, (p, HV, K, V, BT, BV, NUM_STAGES, HAS_H0, USE_CACHE, STORE_FINAL, HAS_D, D_PER_CHANNEL,
                    SWEEP_SCORES, STORE_CHUNK_STATES, 1, WY, OUTPUTS, CHAINED)),
        (_loads, (p, HV, K, V, BT, BV, NUM_STAGES, HAS_H0, USE_CACHE, STORE_FINAL, HAS_D, D_PER_CHANNEL,
                  SWEEP_SCORES, WY, OUTPUTS, CHAINED)),
    ], [4, 4, 1], [OUT_REGS, OUT_REGS, LOAD_REGS])
