"""A prototype of the prep kernel in Gluon (GPU only, not used by the library): with the value heads
of a GVA pair in one program (their q, k tiles and products shared) and their two inverse chains
interleaved on asynchronous tensor-core products, is the prep's SM-time cut?

    python -m benchmarks.gluon_prep_proto --workload NAME --out FILE

Scope: dense GDN (M = 1), bf16 inputs, L2 norm in kernel, gates, T a multiple of 64, K = 128, an
even number of value heads per q/k head, every chunk's steps contractions (0 <= beta |k|^2 <= 2 for
normalised k: the fp16 inverse of the Triton prep; a chunk that is not is counted in ``flags`` and
the benchmark refuses the result). It writes the Triton prep's scratch (``wy``, ``aqk``, ``coef``,
:func:`recurscan.kernels.chunk_delta.chunk_delta_prep_kernel` has their layout and algebra), so the
Triton sweep runs on it unchanged.

Per program (chunk c, value heads hv0 = 2p and hv0 + 1, both reading q/k head hv0 // (HV / H)):

1. the q, k tiles by bulk copies; K K^T, Q Q^T and Q K^T as one asynchronous group;
2. the norms from the diagonals (row and column vectors from two reductions, no layout change);
3. per head: gates (within-chunk cumulative sums as masked row / column sums of a [64, 64] tile,
   in both vector layouts), the coefficients, G, aqk = G o (scale Q K^T) normalised, A;
4. the two gate-free inverses by recursive block doubling (ten products each, as the Triton
   prep's ``_wy_inverse``, fp16 operands), one head's product issued while the other's waits;
5. wy = (G diag(beta)) o Tinv for both heads.

Its roundings differ from the Triton prep's (the order of the cumulative sums and of the norm
factors), so it is compared with a tolerance, not bit for bit.
"""
from __future__ import annotations

import argparse
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BT = gl.constexpr(64)
HOST_BT = 64
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _head_gates(g, beta, r0, hv, o_r, o_c, HV: gl.constexpr):
    """One value head's gates on the chunk's rows, in both vector layouts of a [BT, BT] tile:
    (gc_r, gc_c, seg_r, seg_c, beta_r, beta_c). gc sums the finite log2 decays of rows <= i, seg
    counts the resets (log2 decay < -150) at rows <= i."""
    g_r = gl.load(g + (r0 + o_r) * HV + hv).to(gl.float32) * LOG2E
    g_c = gl.load(g + (r0 + o_c) * HV + hv).to(gl.float32) * LOG2E
    reset_r = g_r < -150.0
    reset_c = g_c < -150.0
    g_r = gl.where(reset_r, 0.0, g_r)
    g_c = gl.where(reset_c, 0.0, g_c)
    upto_r = o_c[None, :] <= o_r[:, None]  # [i, j]: j <= i
    gc_r = gl.sum(gl.where(upto_r, g_c[None, :], 0.0), axis=1)
    seg_r = gl.sum(gl.where(upto_r, reset_c[None, :].to(gl.int32), 0), axis=1)
    upto_c = o_r[:, None] <= o_c[None, :]  # [i, j]: i <= j
    gc_c = gl.sum(gl.where(upto_c, g_r[:, None], 0.0), axis=0)
    seg_c = gl.sum(gl.where(upto_c, reset_r[:, None].to(gl.int32), 0), axis=0)
    beta_r = gl.load(beta + (r0 + o_r) * HV + hv).to(gl.float32)
    beta_c = gl.load(beta + (r0 + o_c) * HV + hv).to(gl.float32)
    return gc_r, gc_c, seg_r, seg_c, beta_r, beta_c


@gluon.jit
def _head_outputs(gc_r, gc_c, seg_r, seg_c, beta_r, beta_c, KKn, QKn, rk_r, rq_r, ksq_r, o_r, o_c, coef, aqk, flags,
                  r0, slot, hv, HV: gl.constexpr):
    """One head's coefficients and aqk (stored); returns its (G diag(beta)) and A, both fp16."""
    gc_last = gl.sum(gl.where(o_r == BT - 1, gc_r, 0.0), axis=0)
    seg_last = gl.sum(gl.where(o_r == BT - 1, seg_r, 0), axis=0)
    lam = gl.where(seg_r == 0, gl.exp2(gc_r), 0.0)
    gam = gl.where(seg_r == seg_last, gl.exp2(gl.where(seg_r == seg_last, gc_last - gc_r, 0.0)), 0.0)
    lam_last = gl.where(seg_last == 0, gl.exp2(gc_last), 0.0)
    p_coef = coef + ((slot * HV + hv) * BT + o_r) * 4
    gl.store(p_coef, lam * rk_r)
    gl.store(p_coef + 1, lam * rq_r)
    gl.store(p_coef + 2, gam * rk_r)
    gl.store(p_coef + 3, gl.zeros_like(lam) + lam_last, mask=o_r == 0)

    causal = o_r[:, None] >= o_c[None, :]
    G = gl.where(causal & (seg_r[:, None] == seg_c[None, :]), gl.exp2(gc_r[:, None] - gc_c[None, :]), 0.0)
    p_tile = ((r0 + o_r) * HV + hv)[:, None] * BT + o_c[None, :]
    gl.store(aqk + p_tile, (G * QKn).to(aqk.dtype.element_ty))
    Gb = (G * beta_c[None, :]).to(gl.float16)

    growth = gl.max(beta_r * (rk_r * rk_r * ksq_r), axis=0)
    contraction = (growth <= 2.0) & (gl.min(beta_r, axis=0) >= 0.0)
    gl.atomic_add(flags, gl.where(contraction, 0, 1))
    A = gl.where(o_r[:, None] > o_c[None, :], KKn * beta_r[:, None], 0.0)
    return Gb, A.to(gl.float16)


@gluon.jit
def gluon_prep_kernel(k_desc, q_desc, g, beta, wy, aqk, coef, flags, scale, T, chunk_lo, chunk_span,
                      H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr):
    """Grid (chunks x HV / 2,), chunk-major: program -> (chunk, pair of value heads)."""
    NP: gl.constexpr = HV // 2
    pid = gl.program_id(0)
    i_c = pid // NP
    hv0 = (pid % NP) * 2
    i_h = hv0 // (HV // H)
    i_n = i_c // chunk_span
    i_t = chunk_lo + i_c % chunk_span
    r0 = i_n * T + i_t * BT
    slot = r0 // BT + i_n  # the chunk's coef slot (chunk_delta._chunk_slot, M = 1)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rowl: gl.constexpr = gl.SliceLayout(1, mma)
    coll: gl.constexpr = gl.SliceLayout(0, mma)
    o_r = gl.arange(0, BT, layout=rowl)
    o_c = gl.arange(0, BT, layout=coll)

    k_s = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    q_s = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, k_desc.block_type.nbytes + q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [r0, i_h * K], bar, k_s)
    tma.async_copy_global_to_shared(q_desc, [r0, i_h * K], bar, q_s)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)

    zero = gl.zeros([BT, BT], gl.float32, layout=mma)
    KK = warpgroup_mma(k_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    QQ = warpgroup_mma(q_s, q_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    QK = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    KK, QQ, QK = warpgroup_mma_wait(num_outstanding=0, deps=(KK, QQ, QK))

    eye = o_r[:, None] == o_c[None, :]
    ksq_r = gl.sum(gl.where(eye, KK, 0.0), axis=1)
    rk_r = gl.rsqrt(ksq_r + 1e-6)
    rk_c = gl.rsqrt(gl.sum(gl.where(eye, KK, 0.0), axis=0) + 1e-6)
    rq_r = gl.rsqrt(gl.sum(gl.where(eye, QQ, 0.0), axis=1) + 1e-6) * scale
    QKn = QK * rq_r[:, None] * rk_c[None, :]
    KKn = KK * rk_r[:, None] * rk_c[None, :]

    # Each head's (G diag(beta)) and A are parked in shared memory (fp16) until the inverse and the
    # wy store need them: held in registers beside the two interleaved inverses they spilled.
    f16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BT], gl.float16)
    gb_s = gl.allocate_shared_memory(gl.float16, [2, BT, BT], f16)
    a_s = gl.allocate_shared_memory(gl.float16, [2, BT, BT], f16)
    for h in gl.static_range(2):
        gc_r, gc_c, seg_r, seg_c, beta_r, beta_c = _head_gates(g, beta, r0, hv0 + h, o_r, o_c, HV)
        Gb, A = _head_outputs(gc_r, gc_c, seg_r, seg_c, beta_r, beta_c, KKn, QKn, rk_r, rq_r, ksq_r, o_r, o_c,
                              coef, aqk, flags, r0, slot, hv0 + h, HV)
        gb_s.index(h).store(Gb)
        a_s.index(h).store(A)

    # The two inverses, interleaved: D_2s = D_s - D_s (A_s D_s), five levels, fp16 operands, from
    # D_2 = I - A_1 (the exact inverses of the 2 x 2 diagonal blocks). Formed here, not with each
    # head's A: held across the other head's gates they spilled.
    eye = (o_r[:, None] == o_c[None, :]).to(gl.float32)
    pair = (o_r[:, None] ^ o_c[None, :]) == 1
    T0 = eye - gl.where(pair, a_s.index(0).load(mma).to(gl.float32), 0.0)
    T1 = eye - gl.where(pair, a_s.index(1).load(mma).to(gl.float32), 0.0)
    t_s = gl.allocate_shared_memory(gl.float16, [2, BT, BT], f16)
    x_s = gl.allocate_shared_memory(gl.float16, [2, BT, BT], f16)
    for lvl in gl.static_range(1, 6):
        level = ((o_r[:, None] >> lvl) ^ (o_c[None, :] >> lvl)) == 1
        t_s.index(0).store(T0.to(gl.float16))
        t_s.index(1).store(T1.to(gl.float16))
        fence_async_shared()
        X0 = warpgroup_mma(gl.convert_layout(gl.where(level, a_s.index(0).load(mma), 0.0), a16), t_s.index(0), zero,
                           use_acc=False, is_async=True)
        X1 = warpgroup_mma(gl.convert_layout(gl.where(level, a_s.index(1).load(mma), 0.0), a16), t_s.index(1), zero,
                           use_acc=False, is_async=True)
        X0 = warpgroup_mma_wait(num_outstanding=1, deps=(X0,))
        x_s.index(0).store(X0.to(gl.float16))
        fence_async_shared()
        P0 = warpgroup_mma(gl.convert_layout(T0.to(gl.float16), a16), x_s.index(0), zero, use_acc=False,
                           is_async=True)
        X1 = warpgroup_mma_wait(num_outstanding=1, deps=(X1,))
        x_s.index(1).store(X1.to(gl.float16))
        fence_async_shared()
        P1 = warpgroup_mma(gl.convert_layout(T1.to(gl.float16), a16), x_s.index(1), zero, use_acc=False,
                           is_async=True)
        P0 = warpgroup_mma_wait(num_outstanding=1, deps=(P0,))
        T0 = T0 - P0
        P1 = warpgroup_mma_wait(num_outstanding=0, deps=(P1,))
        T1 = T1 - P1

    p_tile = ((r0 + o_r) * HV + hv0)[:, None] * BT + o_c[None, :]
    gl.store(wy + p_tile, (gb_s.index(0).load(mma).to(gl.float32) * T0).to(wy.dtype.element_ty))
    gl.store(wy + p_tile + BT, (gb_s.index(1).load(mma).to(gl.float32) * T1).to(wy.dtype.element_ty))


def _desc(t2d, block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), block, layout)


def gluon_prep(q, k, g, beta, wy, aqk, coef, flags, scale=None, chunk_lo=0, chunk_span=None):
    """Launch the prototype over token chunks [chunk_lo, chunk_lo + chunk_span) of every sequence,
    writing the Triton prep's scratch (``wy``, ``aqk`` [B, T, HV, 64], ``coef``)."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    if T % HOST_BT or K != 128 or (HV // H) % 2 or q.dtype != torch.bfloat16:
        raise ValueError("gluon_prep prototype: dense bf16, T % 64 == 0, K = 128, an even HV / H")
    chunk_span = T // HOST_BT if chunk_span is None else chunk_span
    scale = K ** -0.5 if scale is None else scale
    k_desc = _desc(k.reshape(B * T, H * K), [HOST_BT, K])
    q_desc = _desc(q.reshape(B * T, H * K), [HOST_BT, K])
    gluon_prep_kernel[(B * chunk_span * (HV // 2),)](k_desc, q_desc, g, beta, wy, aqk, coef, flags, scale, T,
                                                     chunk_lo, chunk_span, H=H, HV=HV, K=K, num_warps=4)


def measure(name, rep_ms):
    """The prep alone (graph replay): the Triton prep at the planner's register cap against the
    prototype; the scratch compared (relative RMS), and the whole op's outputs with the Triton
    sweep run on each prep's scratch."""
    import triton.testing as tt

    from recurscan.kernels._launch import jit_launch
    from recurscan.kernels.chunk_delta import BUFFER_NAMES, CALL_NAMES, _empty, plan_chunk_delta

    from .gpu_chunk_delta import kernel_inputs

    (q, k, v, g, beta), M, cu, kw = kernel_inputs(name)
    if M != 1 or cu is not None:
        raise ValueError(f"{name}: the prototype takes dense GDN")
    inputs = (q, k, v, g, beta, None, None, None, None, None, None)
    plan = plan_chunk_delta(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True, block_v=64,
                            num_warps=4, num_stages=3, tma_store=True, prep_maxnreg=168)
    bufs = {n: (_empty(*sh, dtype=dt, device=plan.device) if fill is None else
                torch.full(sh, fill, dtype=dt, device=plan.device)) for n, (sh, dt, fill) in plan.buffers.items()}
    values = inputs + tuple(bufs.get(n) for n in BUFFER_NAMES)
    prep_step, sweep_step = plan.steps
    launches = {}

    def run_step(step):  # Triton's JIT the first time (or where no direct launch is made), then direct
        launch = launches.get(id(step))
        if launch is None:
            launches[id(step)] = jit_launch(step.kernel, step.grid, step.kwargs, step.options, CALL_NAMES, values)
        else:
            launch(values)

    def rel(a, b):
        return ((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()).item()

    row = {"workload": name}
    flags = torch.zeros(1, dtype=torch.int32, device=q.device)
    with torch.no_grad():
        run_step(prep_step)
        run_step(sweep_step)
        ref = {n: bufs[n].clone() for n in ("wy", "aqk", "coef", "o", "final")}
        for n in ("wy", "aqk", "coef"):
            bufs[n].fill_(float("nan"))
        gluon_prep(q, k, g, beta, bufs["wy"], bufs["aqk"], bufs["coef"], flags)
        run_step(sweep_step)
        torch.cuda.synchronize()
        row["non_contractive_chunks"] = int(flags.item())
        written = torch.isfinite(ref["coef"])  # coef has slots no chunk owns (chunk_delta._chunk_slot)
        row["rel_rms_vs_triton_prep"] = {n: rel(bufs[n], ref[n]) for n in ("wy", "aqk", "o", "final")}
        row["rel_rms_vs_triton_prep"]["coef"] = rel(bufs["coef"][written], ref["coef"][written])
        times = {}
        for key, fn in (("triton_prep", lambda: run_step(prep_step)),
                        ("gluon_prep", lambda: gluon_prep(q, k, g, beta, bufs["wy"], bufs["aqk"], bufs["coef"],
                                                          flags))):
            ms = tt.do_bench_cudagraph(fn, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
            times[key] = {"median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2]}
        row["times"] = times
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gluon_prep_proto")
    ap.add_argument("--workload", action="append", help="default: gdn_b1_t16384_h16_hv32")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = [measure(n, args.rep_ms) for n in args.workload or ["gdn_b1_t16384_h16_hv32"]]
    if args.out:
        from .runner import save_rows
        save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
