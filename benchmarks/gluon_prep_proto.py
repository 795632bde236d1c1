"""A Gluon prototype of the delta-rule prep whose WY inverse runs on small products through shared
memory (issue 21; GPU only, not in the package). Does the prep of another design pay, before it is
built with every feature of the Triton prep (``recurscan.kernels.delta.prep``, its twin here)?

The Triton prep's inverse takes its first three doubling levels on the 16 x 16 diagonal blocks and
its last two on [64, 64] products; by 16 x 16 blocks throughout it was faster alone
(``benchmarks/inverse_forms.py``) but slower in the prep with its blocks moved through L2
(perf-history, 2026-12-06, e05461d): Triton gives a kernel no shared memory of its own. Here, per
program (one warpgroup, one (chunk, value head)):

1. k and q land in shared memory; K K^T, Q K^T and Q Q^T on wgmma, one wait.
2. Gates, norm factors, the sweep's coefficients and aqk as the twin forms them (no resets, no
   non-finite rows: the prototype's inputs have neither).
3. The inverse, fp16 operands and float32 sums (every chunk's steps contractions, as normalised
   keys and beta in (0, 1) make them): the diagonal blocks D_1..D_4 taken out of A in registers (a masked
   sum over the reshaped tile, within each thread) and inverted as a [4, 16, 16] batch on mma.sync
   (a warp a block, three doubling levels); then through shared memory X_21 = -D_2 A_21 D_1 and
   X_43 = -D_4 A_43 D_3 (a batch of two) and X_BA = -D_B A_BA D_A ([32, 32]), each block written
   to the [64, 64] tile of Tinv in shared memory, read back once for wy = (G o Tinv) diag(beta).

The outputs (wy, aqk, coef) are the twin's, in its layouts; ``main`` compares them with the twin's
on the GPU and times both at B1 T16384 HV32, B4 T8192 HV64 and B4 T4096 (the prep's item counts), and one
program's latency alone on an SM and three to an SM (one-chunk sequences):

    python benchmarks/gluon_prep_proto.py --out benchmarks/results/gluon_prep_proto.json
    python benchmarks/gluon_prep_proto.py --parts --maxnreg 168 --out ...   # where its time goes
    python benchmarks/gluon_prep_proto.py --parts --vectors 0 --vectors 1 --out ...   # VECTORS forms too
    python -m tests.helpers.sm90 gluon-prep-proto-sass   # each part's SASS, offline

Measured on an H100 (perf-history, 2026-12-06, ac20031..46e71e7): right, and no faster than the
Triton prep (the same latency alone, 18-20% slower at three programs an SM). Its parts (5401f53):
the inverse 38% of its SM-time, the gates to aqk 26%, the loads and products 35%; a program for a
q/k head's value heads was slower (96869a9, removed). Those runs had the inverse's shared scratch
unswizzled, its rows meeting in one bank on every operand load; swizzled (``--swizzle``, on the
H200 at da76e4d) it is 6-8% faster than the Triton prep at 168 registers: B1 T16384 HV32 0.191 ms
against 0.208, HV64 0.746 against 0.808, B4 T4096 0.103 against 0.110.

    python benchmarks/gluon_prep_proto.py --swizzle --maxnreg 168 --maxnreg 0 --out ...

Scope: dense, M = 1, K = 128, 16-bit inputs, l2norm in the kernel, g and beta given, finite
decays without resets, contraction chunks.
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from recurscan.kernels.gluon.wy_inverse import inverse_on_blocks
from tests.helpers.tolerances import relative_rms

BT = 64
DEVICE = "cuda"  # a dry run of the host code on the CPU (the kernel stubbed out) sets "cpu"


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def gluon_prep_kernel(q, k, g, beta, wy, aqk, coef, scale, T, H: gl.constexpr, HV: gl.constexpr,
                      K: gl.constexpr, BT: gl.constexpr, PART: gl.constexpr = 0, VECTORS: gl.constexpr = 0,
                      SWIZZLE: gl.constexpr = False):
    """Grid (chunks x HV,), chunk-major as the twin's: writes wy, aqk and coef of the program's
    (chunk, value head) as ``chunk_delta_prep_kernel`` does for this scope. PART (where the time
    goes; the outputs then are not the prep's): 1 skips the inverse (wy = G diag(beta)); 2 stops
    after the three products (their sum stored as wy). VECTORS 1: g and beta loaded a second time
    in the column slice that uses them, and the cumulative gates as masked sums of the [BT, BT]
    tile instead of a scan: along the rows (within each thread and its quad) for the rows' gates,
    down the columns (across the warps) for the columns'; beta's columns and the row gates no
    longer go through shared memory. VECTORS 2: form 0 with beta's columns loaded (one layout move
    fewer: offline 26 barriers against 28, 2104 instructions against 1936)."""
    gl.static_assert(gl.num_warps() == 4, "one warpgroup")
    gl.static_assert(BT == 64, "chunks of 64 rows")
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    rowv: gl.constexpr = gl.SliceLayout(1, mma)
    colv: gl.constexpr = gl.SliceLayout(0, mma)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    if SWIZZLE:  # the inverse's scratch swizzled (unswizzled, its rows meet in one bank: the fused prototype's)
        plain2: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        plain3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[2, 1, 0])
    else:
        plain2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        plain3: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])

    pid = gl.program_id(0).to(gl.int64)
    i_c = pid // HV
    i_hv = pid % HV
    i_h = i_hv // (HV // H)
    NT = (T + BT - 1) // BT
    i_n = i_c // NT
    i_t = i_c % NT
    bos = i_n * T
    eos = bos + T
    r0 = bos + i_t * BT

    # 1. the tiles, and the three products over K
    o_l = gl.arange(0, BT, layout=gl.SliceLayout(1, ld))
    o_kl = gl.arange(0, K, layout=gl.SliceLayout(0, ld))
    rows_l = r0 + o_l.to(gl.int64)
    m_l = (rows_l < eos)[:, None] & (o_kl < K)[None, :]
    p_qk = (rows_l * H + i_h)[:, None] * K + o_kl[None, :]
    smem_qk: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], k.dtype.element_ty)
    k_s = gl.allocate_shared_memory(k.dtype.element_ty, [BT, K], smem_qk)
    q_s = gl.allocate_shared_memory(k.dtype.element_ty, [BT, K], smem_qk)
    k_s.store(gl.load(k + p_qk, mask=m_l, other=0.0))
    q_s.store(gl.load(q + p_qk, mask=m_l, other=0.0))
    o_t = gl.arange(0, BT, layout=rowv)
    o_c = gl.arange(0, BT, layout=colv)
    rows = r0 + o_t.to(gl.int64)
    m_r = rows < eos
    b_g = gl.load(g + rows * HV + i_hv, mask=m_r, other=0.0).to(gl.float32) * 1.4426950408889634
    b_beta = gl.load(beta + rows * HV + i_hv, mask=m_r, other=0.0).to(gl.float32)
    if VECTORS != 0:
        rows_c = r0 + o_c.to(gl.int64)
        m_c = rows_c < eos
        b_g_c = gl.load(g + rows_c * HV + i_hv, mask=m_c, other=0.0).to(gl.float32) * 1.4426950408889634
        beta_c = gl.load(beta + rows_c * HV + i_hv, mask=m_c, other=0.0).to(gl.float32)
    fence_async_shared()
    gl.thread_barrier()
    zero = gl.zeros([BT, BT], gl.float32, mma)
    kk = warpgroup_mma(k_s, k_s.permute((1, 0)), zero, is_async=True)
    qk = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, is_async=True)
    qq = warpgroup_mma(q_s, q_s.permute((1, 0)), zero, is_async=True)
    kk, qk, qq = warpgroup_mma_wait(num_outstanding=0, deps=(kk, qk, qq))

    if PART == 2:
        p_kk = wy + (r0 * HV + i_hv) * BT + (gl.arange(0, BT, layout=rowv) * (HV * BT))[:, None] + \
            gl.arange(0, BT, layout=colv)[None, :]
        gl.store(p_kk, (kk + qk + qq).to(wy.dtype.element_ty))
    else:
        # 2. gates, norm factors, coefficients, aqk
        r = o_t[:, None]
        c = o_c[None, :]
        eye = r == c
        if VECTORS == 1:
            gc = gl.sum(gl.where(c <= r, b_g_c[None, :], 0.0), axis=1)
            gc_c = gl.sum(gl.where(r <= c, b_g[:, None], 0.0), axis=0)
        else:
            line: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # the scan's layout (not the wgmma's slices)
            gc = gl.convert_layout(gl.associative_scan(gl.convert_layout(b_g, line), 0, _add), rowv)
            gc_c = gl.convert_layout(gc, colv)
        k_sq = gl.sum(gl.where(eye, kk, 0.0), axis=1)
        rk = gl.rsqrt(k_sq + 1e-6)
        rq = gl.rsqrt(gl.sum(gl.where(eye, qq, 0.0), axis=1) + 1e-6) * scale
        rk_c = gl.convert_layout(rk, colv)
        gc_last = gl.sum(gl.where(o_t == BT - 1, gc, 0.0), axis=0)
        lam = gl.exp2(gc)
        gam = gl.exp2(gc_last - gc)
        p_coef = coef + ((((bos + i_t * BT) // BT + i_n) * HV + i_hv) * BT + o_t) * 4
        gl.store(p_coef, lam * rk, mask=m_r)
        gl.store(p_coef + 1, lam * rq, mask=m_r)
        gl.store(p_coef + 2, gam * rk, mask=m_r)
        gl.store(p_coef + 3, gl.zeros([BT], gl.float32, rowv) + gl.exp2(gc_last), mask=o_t == 0)
        causal = r >= c
        G = gl.where(causal, gl.exp2(gc[:, None] - gc_c[None, :]), 0.0)
        p_out = (rows * HV + i_hv)[:, None] * BT + c
        gl.store(aqk + p_out, (G * qk * rq[:, None] * rk_c[None, :]).to(aqk.dtype.element_ty), mask=m_r[:, None])
        if VECTORS == 0:
            beta_c = gl.convert_layout(b_beta, colv)
        Gb = (G * beta_c[None, :]).to(gl.float16)

        if PART == 1:
            Tinv = gl.where(eye, 1.0, 0.0)
        else:
            # 3. the inverse: A = diag(beta) strictLower(K K^T) for normalised keys
            A = gl.where(r > c, kk * (b_beta * rk)[:, None] * rk_c[None, :], 0.0)
            d_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], plain3)
            b_s = gl.allocate_shared_memory(gl.float16, [4, 16, 16], plain3)
            a_s = gl.allocate_shared_memory(gl.float16, [BT, BT], plain2)
            t_s = gl.allocate_shared_memory(gl.float16, [BT, BT], plain2)
            x_s = gl.allocate_shared_memory(gl.float16, [2, 16, 16], plain3)
            Tinv = inverse_on_blocks(A, r, c, d_s, b_s, a_s, t_s, x_s, mma, True)
        p_wy = wy + (r0 * HV + i_hv) * BT + (o_t * (HV * BT))[:, None] + c
        gl.store(p_wy, (Gb.to(gl.float32) * Tinv.to(gl.float32)).to(wy.dtype.element_ty), mask=(o_t < eos - r0)[:, None])


def gluon_prep(q, k, g, beta, wy, aqk, coef, scale: float, maxnreg: int | None = None, part: int = 0,
               vectors: int = 0, swizzle: bool = False) -> None:
    """Launch the prototype on dense ``q, k [B, T, H, K]``, ``g, beta [B, T, HV]`` into the
    twin's buffers (``wy, aqk [B * T, HV, 64]``, ``coef``)."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    grid = (B * triton.cdiv(T, BT) * HV,)
    options = dict(num_warps=4) if maxnreg is None else dict(num_warps=4, maxnreg=maxnreg)
    gluon_prep_kernel[grid](q, k, g, beta, wy, aqk, coef, scale, T, H=H, HV=HV, K=K, BT=BT, PART=part, VECTORS=vectors,
                            SWIZZLE=swizzle, **options)


def _rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """:func:`relative_rms` with NaN taken as 0 in both (a slot neither prep wrote)."""
    return relative_rms(torch.nan_to_num(got.double(), nan=0.0), torch.nan_to_num(want.double(), nan=0.0))


WORKLOADS = ["gdn_b1_t16384_h16_hv32", "gdn_b4_t8192_h16_hv64", "gdn_b4_t4096_h16"]


def compare(name: str, rep_ms: int, maxnregs: list, swizzle: bool = False) -> list[dict]:
    """One workload: the twin's prep (as planned, alone) and the prototype's at each register cap,
    their outputs compared, each prep timed alone and each output through the planned sweep
    against the float64 chunked oracle."""
    import triton.testing as tt

    from recurscan.launch.delta import DeltaInputs, allocate_buffers, run_delta_launches
    from recurscan.plan import delta_shape
    from recurscan.problem import delta_problem
    from recurscan.reference.delta import gated_delta_rule_chunked

    from benchmarks import registry
    from benchmarks.delta_variants import variant_launches

    x = registry.get(name).make_inputs(DEVICE, 0)
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    assert x["cu_seqlens"] is None and bool(torch.isfinite(g).all()) and float(g.min()) > -100.0
    scale = q.shape[-1] ** -0.5
    shape = delta_shape(delta_problem(q, k, v, g, beta), torch.device(DEVICE))
    kw = dict(use_qk_l2norm_in_kernel=True, output_final_state=True, scale=scale, shape=shape)
    prep = variant_launches(q, k, v, g, beta, stage="prep", **kw)
    sweep = variant_launches(q, k, v, g, beta, stage="sweep", **kw)
    inputs = DeltaInputs(q, k, v, g, beta)
    twin = allocate_buffers(prep)
    for n in ("wy", "aqk", "coef"):  # what a prep leaves unwritten stays NaN in both
        twin[n].fill_(float("nan"))
    mine = {n: torch.full_like(twin[n], float("nan")) for n in ("wy", "aqk", "coef")}
    with torch.no_grad():
        run_delta_launches(prep, inputs, given=twin)
        twin_out = run_delta_launches(sweep, inputs, given=twin)
        reference = gated_delta_rule_chunked(*(t.double() for t in (q, k, v, g, beta)), scale=scale,
                                             use_qk_l2norm_in_kernel=True)
    rows = []
    twin_ms = tt.do_bench_cudagraph(lambda: run_delta_launches(prep, inputs, given=twin), rep=rep_ms)
    for cap in maxnregs:
        gluon_prep(q, k, g, beta, mine["wy"], mine["aqk"], mine["coef"], scale, cap, swizzle=swizzle)
        torch.cuda.synchronize()
        out = run_delta_launches(sweep, inputs, given=mine)
        query_rows = {n: _rel_rms(mine[n], twin[n]) for n in ("wy", "aqk")}
        coef_err = _rel_rms(mine["coef"], twin["coef"])
        ms = tt.do_bench_cudagraph(lambda: gluon_prep(q, k, g, beta, mine["wy"], mine["aqk"], mine["coef"], scale,
                                                      cap, swizzle=swizzle), rep=rep_ms)
        row = dict(workload=name, maxnreg=cap, swizzle=swizzle, gluon_prep_ms=ms, twin_prep_ms=twin_ms, twin_over_gluon=twin_ms / ms,
                   wy_rel_rms_vs_twin=query_rows["wy"], aqk_rel_rms_vs_twin=query_rows["aqk"],
                   coef_rel_rms_vs_twin=coef_err,
                   o_rel_rms_vs_f64=_rel_rms(out[0].double(), reference[0]),
                   twin_o_rel_rms_vs_f64=_rel_rms(twin_out[0].double(), reference[0]),
                   state_rel_rms_vs_f64=_rel_rms(out[1].double(), reference[1]),
                   twin_state_rel_rms_vs_f64=_rel_rms(twin_out[1].double(), reference[1]))
        print(row, flush=True)
        rows.append(row)
    return rows


def _kernel_us(fn, name: str) -> float:
    """GPU time (us) of the kernels named ``name...`` in one call of ``fn``, by torch.profiler:
    the median of five calls."""
    import statistics

    from torch.profiler import ProfilerActivity, profile
    times = []
    for _ in range(5):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        times.append(sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA" and e.name.startswith(name)))
    return statistics.median(times)


def latency(per_sm: list, maxnreg: int | None) -> list[dict]:
    """One program's latency, alone on an SM and sharing it (benchmarks/gpu_prep_latency.py's
    measure): sequences of one chunk, H = HV = 1, SMs x ``per_sm`` of them, each prep's kernel
    time (the Triton prep as TEST_SHAPE launches it: four warps, capped at 168 registers)."""
    from recurscan.launch.delta import DeltaInputs, allocate_buffers, run_delta_launches

    from benchmarks.delta_variants import variant_launches
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for n in per_sm:
        gen = torch.Generator(device=DEVICE).manual_seed(n)
        B = sms * n
        q, k, v = (torch.randn(B, BT, 1, 128, generator=gen, device=DEVICE).bfloat16() for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(B, BT, 1, generator=gen, device=DEVICE) + 3.0)
        beta = torch.sigmoid(torch.randn(B, BT, 1, generator=gen, device=DEVICE)).bfloat16()
        prep = variant_launches(q, k, v, g, beta, stage="prep", use_qk_l2norm_in_kernel=True, output_final_state=True)
        inputs = DeltaInputs(q, k, v, g, beta)
        bufs = allocate_buffers(prep)
        with torch.no_grad():
            run_delta_launches(prep, inputs, given=bufs)
            gluon_prep(q, k, g, beta, bufs["wy"], bufs["aqk"], bufs["coef"], 128 ** -0.5, maxnreg)
            twin_us = _kernel_us(lambda: run_delta_launches(prep, inputs, given=bufs), "chunk_delta_prep_kernel")
            mine_us = _kernel_us(lambda: gluon_prep(q, k, g, beta, bufs["wy"], bufs["aqk"], bufs["coef"], 128 ** -0.5,
                                                    maxnreg), "gluon_prep_kernel")
        row = dict(programs=B, programs_per_sm=n, maxnreg=maxnreg, gluon_prep_us=mine_us, twin_prep_us=twin_us)
        print(row, flush=True)
        rows.append(row)
    return rows


def parts(maxnreg: int | None, rep_ms: int, vectors: int = 0) -> list[dict]:
    """Where the prototype's time goes: each PART (0 the prep, 1 without the inverse, 2 the loads
    and the three products alone) timed at B4 T8192 HV64 (graph replay) and one program's
    latency alone on an SM (one-chunk sequences, the kernel's time). For a VECTORS form other than
    0, the whole prep's outputs are compared with form 0's (relative RMS)."""
    import triton.testing as tt

    from benchmarks import registry
    x = registry.get("gdn_b4_t8192_h16_hv64").make_inputs(DEVICE, 0)
    q, k, g, beta = (x[n] for n in ("q", "k", "g", "beta"))
    B, T, H, _ = q.shape
    HV = g.shape[2]
    wy, aqk = (torch.empty(B * T, HV, BT, dtype=q.dtype, device=DEVICE) for _ in range(2))
    coef = torch.empty(T // BT * B + B, HV, BT, 4, device=DEVICE)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    q1, k1 = (torch.randn(sms, BT, 1, 128, generator=gen, device=DEVICE).bfloat16() for _ in range(2))
    g1 = torch.nn.functional.logsigmoid(torch.randn(sms, BT, 1, generator=gen, device=DEVICE) + 3.0)
    b1 = torch.sigmoid(torch.randn(sms, BT, 1, generator=gen, device=DEVICE)).bfloat16()
    wy1, aqk1 = (torch.empty(sms * BT, 1, BT, dtype=q.dtype, device=DEVICE) for _ in range(2))
    coef1 = torch.empty(2 * sms, 1, BT, 4, device=DEVICE)
    rows = []
    for part in (0, 1, 2):
        def hv64():
            gluon_prep(q, k, g, beta, wy, aqk, coef, 128 ** -0.5, maxnreg, part, vectors)

        def alone():
            gluon_prep(q1, k1, g1, b1, wy1, aqk1, coef1, 128 ** -0.5, maxnreg, part, vectors)
        hv64()
        alone()
        row = dict(part=part, maxnreg=maxnreg, vectors=vectors, hv64_ms=tt.do_bench_cudagraph(hv64, rep=rep_ms),
                   alone_us=_kernel_us(alone, "gluon_prep_kernel"))
        if part == 0 and vectors != 0:  # the same prep in another form: its outputs against form 0's
            want = {n: torch.full_like(t, float("nan")) for n, t in (("wy", wy), ("aqk", aqk), ("coef", coef))}
            gluon_prep(q, k, g, beta, want["wy"], want["aqk"], want["coef"], 128 ** -0.5, maxnreg, 0, 0)
            for n, got in (("wy", wy), ("aqk", aqk), ("coef", coef)):
                row[f"{n}_rel_rms_vs_vectors_0"] = _rel_rms(got, want[n])
        print(row, flush=True)
        rows.append(row)
    return rows


def main():
    from benchmarks.runner import save_rows
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append")
    ap.add_argument("--maxnreg", type=int, action="append", help="register caps of the prototype (0: none)")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--parts", action="store_true", help="only where the time goes (:func:`parts`)")
    ap.add_argument("--vectors", type=int, action="append", help="with --parts: VECTORS forms (default 0)")
    ap.add_argument("--swizzle", action="store_true", help="the inverse's shared scratch swizzled (compare only)")
    ap.add_argument("--out")
    args = ap.parse_args()
    caps = [c or None for c in (args.maxnreg or [0, 168])]
    if args.parts:
        rows = [row for cap in caps for vec in (args.vectors or [0]) for row in parts(cap, args.rep_ms, vec)]
    else:
        rows = [row for name in (args.workload or WORKLOADS) for row in compare(name, args.rep_ms, caps, args.swizzle)]
        if not args.swizzle:
            rows += [row for cap in caps for row in latency([1, 3], cap)]
    if args.out:
        save_rows(rows, args.out, torch.device("cuda"))


if __name__ == "__main__":
    main()
