"""Registers, stack and shared memory of the chunked delta-rule kernels compiled for sm_90, with
no GPU (Triton compiles for a named target; its bundled ptxas and cuobjdump do the rest).

    python -m benchmarks.sm90_resources                     # the planner's launch shapes
    python -m benchmarks.sm90_resources --sweep 64:4:3:1:1  # BV:warps:stages:v_product[:tma_store]
    python -m benchmarks.sm90_resources --prep 0 --lines 12  # the prep's source lines by SASS count

Each sweep line also profiles the chunk loop in the SASS (instructions, barriers, wgmmas per chunk).

The forward's kernels (``--sweep``, ``--prep``) and the GLA engine's (``--gla``) compile as the launch
layer builds them (tests/helpers/sm90.py: bf16, K = V = 128, dense GDN or varlen GDP). The backward's
(``--backward``) from signatures written here, pointers declared 16-byte aligned
(``tt.divisibility``) as the JIT specialises them for aligned tensors: without that, loads compile
to 2-byte scalars and the figures mean nothing; H 16, HV 32, K = V = 128, bf16, dense.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from recurscan.kernels.delta.backward import (chunk_delta_bwd_dqdk_kernel,
                                              chunk_delta_bwd_scores_kernel, chunk_delta_bwd_sweep_kernel)
from recurscan.plan.delta import DeltaShape


def loop_profile(sass: str, top: int = 2) -> str:
    """The loops of a compiled sweep that hold wgmma instructions: each conditional backward branch
    (unconditional ones jump back from out-of-line wait loops) whose body holds HGMMA (wgmma) or
    HMMA; per iteration its instruction, barrier, wgmma and local-memory (spill) instruction
    counts, the ``top`` with the most of those first (the sweep's chunk loop; a second is the rare
    replay loop; a warp-specialised kernel's partitions' loops)."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in
             (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", l) for l in sass.splitlines()) if m]
    loops = []
    for addr, ins in lines:
        b = re.search(r"^@!?U?P\w+\s+BRA\b.*?(0x[0-9a-f]+)", ins)  # conditional: a loop's back edge
        if b and int(b.group(1), 16) < addr:
            body = [i for a, i in lines if int(b.group(1), 16) <= a <= addr]
            n_mma = sum("HGMMA" in i or "HMMA" in i for i in body)
            if n_mma:
                loops.append((len(body), sum("BAR.SYNC" in i or "BAR.ARV" in i for i in body), n_mma,
                              sum(i.split()[0].startswith(("LDL", "STL")) or " LDL" in i or " STL" in i
                                  for i in body)))
    if not loops:
        return f"no loop ({len(lines)} instructions)"
    loops.sort(key=lambda x: -x[2])
    return "; ".join(f"loop: {n} instructions, {bars} barriers, {mma} HGMMA or HMMA, {spill} local ld/st"
                     for n, bars, mma, spill in loops[:top])


def source_lines(cubin: bytes, top: int) -> str:
    """The ``top`` source lines with the most SASS instructions (static counts; ``nvdisasm -gi``
    attributes each instruction to the source line it came from), with their commonest opcodes.
    Where a kernel's instructions go; not what its time is (the prep's executed path went from
    2440 to 2016 instructions a warp and got slower, docs/kernels-chunk-delta.md)."""
    import collections
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-gi", "-c", f.name], capture_output=True, text=True).stdout
    where, count, ops = None, collections.Counter(), collections.defaultdict(collections.Counter)
    for line in text.splitlines():
        loc = re.search(r'//##.*"([^"]+)", line (\d+)', line)
        if loc:
            where = f"{os.path.basename(loc.group(1))}:{loc.group(2)}"
            continue
        ins = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if ins:
            count[where] += 1
            ops[where][ins.group(1)] += 1
    return "\n".join(f"  {n:5d} {w}  {dict(ops[w].most_common(5))}" for w, n in count.most_common(top))


def _compile(kernel, sig, const, num_warps, num_stages=2, maxnreg=None, lines=0):
    names = kernel.arg_names
    sig = dict(sig, **{k: "constexpr" for k in const})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*") or n in ("T", "s0_n", "s0_h", "s0_k")}
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages,
                                                                                 **({"maxnreg": maxnreg} if maxnreg else {})))
    return resources(ck, lines)


def resources(ck, lines=0, loops=2) -> str:
    """Registers, stack (spills), shared memory and the chunk loop's profile of a compiled kernel
    (its ``loops`` loops with the most tensor instructions); with ``lines``, the source lines with
    the most SASS instructions."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    line = next(l for l in usage.splitlines() if "REG:" in l).split()
    regs = next(x for x in line if x.startswith("REG:"))
    stack = next(x for x in line if x.startswith("STACK:"))
    out = f"{regs} {stack} shared {ck.metadata.shared} B; {loop_profile(sass, loops)}"
    return out + ("\n" + source_lines(ck.asm["cubin"], lines) if lines else "")


def peak_live_registers(cubin: bytes) -> int | None:
    """The most general registers live at any instruction of a compiled kernel (``nvdisasm -plr``'s
    GPR column; of a warp-specialised kernel, the largest over its partitions), None where it gives
    no counts."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", "-plr", "-lrm", "count", f.name], capture_output=True, text=True).stdout
    counts = [int(m.group(1)) for m in (re.search(r"// \|\s+(\d+)\s+\|", line) for line in text.splitlines()) if m]
    return max(counts) if counts else None


#: The delta backward's Gluon forms (tests/helpers/sm90.py SHAPES) and the cases they are built for.
DELTA_BACKWARD_TWINS = (("Gluon scores", ("GDN dense, H = HV", "GDN varlen, GVA")),
                        ("Gluon dq and dk, warp-specialised", ("GDN dense, H = HV", "GDN varlen, GVA",
                                                               "GDN varlen, H = HV")),
                        ("Gluon dq and dk", ("GDN dense, H = HV", "GDN varlen, GVA")))


def delta_backward_twins() -> str:
    """Each Gluon kernel of the delta backward's forms as the launch layer builds it
    (tests/helpers/sm90.py's launches, the recompute's outputs in their dtypes), K 128: registers,
    stack, shared memory, its loops' profile and the peak of live registers; then K 64 (V 64 for the
    scores kernel, 128 for dq and dk) for the warp-specialised forms: their shared memory."""
    from tests.helpers import sm90
    out = []
    for shape, cases in DELTA_BACKWARD_TWINS:
        for case in cases:
            for step, names, values in sm90.case_launches(case, shape):
                if type(step.kernel).__name__ != "GluonJITFunction":
                    continue
                ck = sm90.compile_for_sm90(step, names, values)
                peak = peak_live_registers(ck.asm["cubin"])
                out.append(f"{shape} | {case} | K 128 | {resources(ck)} | peak "
                           f"{peak if peak is not None else '(nvdisasm -plr gave no count)'}")
    for shape, cases in DELTA_BACKWARD_TWINS[:2]:
        V = 64 if shape == "Gluon scores" else 128
        for case in cases[:2]:
            lines = [line for line in sm90.compile_case(case, shape, 64, V) if line.startswith("gluon_")]
            out += [f"{shape} | {case} | K 64 (V {V}) | {line}" for line in lines]
    return "\n".join(out)


def forward(shape, gdp=False, lines=0) -> str:
    """The delta-rule forward's kernels in ``shape`` (a DeltaShape) for sm_90 as the launch layer
    builds them (tests/helpers/sm90.py): dense GDN, or with ``gdp`` varlen GDP M = 2."""
    from functools import partial
    from tests.helpers import sm90
    case = "GDP M 2 varlen" if gdp else "GDN dense, H = HV"
    return "\n".join("  " + line for line in sm90.compile_delta_forward(case, shape, partial(resources, lines=lines)))


def backward(BV=32, warps=8, grads_warps=8, grads_BV=None):
    """The backward's reverse sweep (value blocks of BV) and parallel stage (of grads_BV, default
    BV), dense GDN."""
    p, f = "*bf16", "*fp32"
    sig = dict(q=p, k=p, beta=p, do=p, winv=p, aqk=p, coef=f, dstates=p, dht=f, dh0=f, dy_out=p, dv=p, cu_seqlens="*i32", chunk_offsets="*i32", T="i32", n_cs_rows="i32")
    const = dict(H=16, HV=32, K=128, V=128, BT=64, BK=128, BV=BV, IS_VARLEN=False, HAS_DHT=True, STORE_DH0=True,
                 DOT_PRECISION="tf32", DT=tl.bfloat16, M=1)
    swept = _compile(chunk_delta_bwd_sweep_kernel, sig, const, warps)
    sweep_BV, BV = BV, grads_BV or BV
    const = dict(H=16, HV=32, K=128, V=128, BT=64, BK=128, BV=BV, IS_VARLEN=False, HAS_G=True, USE_L2NORM=True,
                 DOT_PRECISION="tf32", DT=tl.bfloat16, M=1)
    dqdk_const = dict(const, PART=1, GROUP=1)
    scores_sig = dict(q=p, k=p, v=p, g="*fp32", beta=p, do=p, dy=p, u=p, ks=f, dg=f, dbeta=f, bdyks=f, scratch=p,
                      cu_seqlens="*i32", chunk_indices="*i32", chunk_offsets="*i32", T="i32", n_seq="i32",
                      scale="fp32")
    dqdk_sig = dict(q=p, k=p, g="*fp32", beta=p, do=p, u=p, dy=p, states=p, dstates=p, dq=p, dk=p, dg=f, bdyks=f,
                    scratch=p, cu_seqlens="*i32", chunk_indices="*i32", chunk_offsets="*i32", T="i32", n_seq="i32",
                    scale="fp32", n_cs_rows="i32")
    return f"reverse sweep BV {sweep_BV}, {warps} warps: {swept}\nparallel stage BV {BV}, {grads_warps} warps:" \
           f"\n  scores: {_compile(chunk_delta_bwd_scores_kernel, scores_sig, const, grads_warps)}" \
           f"\n  dk alone: {_compile(chunk_delta_bwd_dqdk_kernel, dqdk_sig, dict(dqdk_const, PART=1), grads_warps)}" \
           f"\n  dq alone: {_compile(chunk_delta_bwd_dqdk_kernel, dqdk_sig, dict(dqdk_const, PART=2), grads_warps)}" \
           f"\n  dk alone, GVA summed: " \
           f"{_compile(chunk_delta_bwd_dqdk_kernel, dqdk_sig, dict(dqdk_const, PART=1, GROUP=2), grads_warps)}" \
           f"\n  dq alone, GVA summed: " \
           f"{_compile(chunk_delta_bwd_dqdk_kernel, dqdk_sig, dict(dqdk_const, PART=2, GROUP=2), grads_warps)}" \
           f"\n  dk then dq: {_compile(chunk_delta_bwd_dqdk_kernel, dqdk_sig, dict(dqdk_const, PART=3), grads_warps)}" \
           f"\n  dk then dq, GVA summed: " \
           f"{_compile(chunk_delta_bwd_dqdk_kernel, dqdk_sig, dict(dqdk_const, PART=3, GROUP=2), grads_warps)}"


def gla(form: str, lines: int = 0) -> str:
    """The GLA engine's kernels for sm_90 as tests/helpers/sm90.py compiles them (dense GDN-sized
    case, bf16, the plan's shape): ``form`` one of that helper's families (``gla``, ``ssd``,
    ``gla-split``, ``ssd-split``, ``gla-per-key``, ``gla-backward``, ...); ``lines``: also the source
    lines with the most SASS instructions."""
    from functools import partial
    describe = partial(resources, lines=lines)
    from tests.helpers import sm90
    case = "GDN dense, H = HV"
    if form in ("gla-backward", "gla-sweep-backward"):
        return "\n".join(sm90.compile_gla_backward(case, describe=describe, on_sweep=form == "gla-sweep-backward"))
    if form == "ssd-group-twins-backward":  # SSD's group (16 value heads of one query/key head) with every
        # Gluon twin of the backward
        return "\n".join(sm90.compile_gla_backward(case, describe=describe, on_sweep=True, group_prep=True,
                                                   group_grads=True, recompute_twin=True))
    if form in ("ssd-benchmark", "ssd-benchmark-group"):  # the benchmark's SSD form, one pass, BV 64, 4 warps
        shape = DeltaShape(64, 4, 3, 4, "sm90_resources: SSD as benchmarked", tma_store=True,
                           group_prep=form.endswith("group"))
        return "\n".join(sm90.compile_ssd_benchmark(shape, describe=describe))
    if form in ("gla-group-sweep", "ssd-group-sweep"):  # the group prep, the sweep gating the scores
        return "\n".join(sm90.compile_gla_sweep("GDN varlen, GVA", "group prep", ssd=form == "ssd-group-sweep",
                                                 describe=describe))
    if form in ("gla-sweep", "ssd-sweep", "gla-per-key-sweep"):  # on the delta sweep, WY off, one pass
        return "\n".join(sm90.compile_gla_sweep(case, "one pass", ssd=form == "ssd-sweep", describe=describe,
                                                 per_key=form == "gla-per-key-sweep"))
    return "\n".join(sm90.compile_gla(case, ssd=form.startswith("ssd"), split=form.endswith("split"),
                                       per_key=form == "gla-per-key", describe=describe))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sm90_resources")
    ap.add_argument("--sweep", action="append", help="BV:warps:stages:v_product[:tma_store] (repeatable)")
    ap.add_argument("--gdp", action="store_true", help="the prep and sweeps of varlen GDP (M = 2) instead of dense GDN")
    ap.add_argument("--prep", action="append", help="maxnreg: the prep alone under a register cap, 0 for "
                                                   "none (repeatable)")
    ap.add_argument("--lines", type=int, default=0, help="with --prep or --gla: the N source lines with the most "
                                                          "SASS instructions")
    ap.add_argument("--backward", nargs="?", const="32:8:8", help="the backward's kernels "
                                                                    "(BV:sweep warps:parallel-stage warps)")
    ap.add_argument("--gla", action="append", help="the GLA engine's kernels in this form (gla, ssd, gla-split, "
                                                   "ssd-split, gla-per-key, gla-backward, gla-sweep, ssd-sweep, gla-per-key-sweep, "
                                                   "gla-group-sweep, ssd-group-sweep, ssd-benchmark, "
                                                   "ssd-benchmark-group, "
                                                   "gla-sweep-backward, ssd-group-twins-backward; "
                                                   "repeatable)")
    ap.add_argument("--delta-backward-twins", action="store_true", help="the delta backward's Gluon kernels "
                                                                            "(results/sm90_delta_backward_specialised.txt)")
    args = ap.parse_args(argv)
    if args.delta_backward_twins:
        print(delta_backward_twins())
        return
    if args.gla:
        for form in args.gla:
            print(f"{form}:\n{gla(form, args.lines)}")
        return
    if args.backward:
        parts = args.backward.split(":")
        print(backward(*map(int, parts[:4])))
        return
    if args.prep:
        for text in args.prep:
            shape = DeltaShape(64, 4, 3, 4, "sm90_resources: the prep under a register cap",
                               prep_maxnreg=int(text) or None)
            print(f"prep, 4 warps, maxnreg {int(text) or '-'}:\n{forward(shape, args.gdp, args.lines)}")
        return
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.sweep or []] or \
        [(128, 8, 3, 1), (64, 4, 3, 1), (64, 4, 2, 1), (64, 4, 2, 0), (32, 4, 2, 0), (16, 4, 2, 0)]
    for BV, warps, stages, vp, tma in (tuple(s_) + (0,)[len(s_) - 4:] for s_ in shapes):
        for segments in ((1, 2) if (BV, vp) == (64, 0) else (1,)):
            shape = DeltaShape(BV, warps, stages, 4, "sm90_resources: a sweep variant", v_product=bool(vp),
                               tma_store=bool(tma), segments=segments)
            print(f"BV {BV:3d} {warps} warps {stages} stages v_product {vp} tma_store {tma} segments {segments}"
                  f"{' (varlen GDP M = 2)' if args.gdp else ''}:\n{forward(shape, args.gdp, args.lines)}")


if __name__ == "__main__":
    main()
