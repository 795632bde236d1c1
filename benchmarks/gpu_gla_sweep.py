"""Scalar-decay GLA and Mamba2 SSD forwards on the delta rule's prep and sweep (WY off) against the
fused GLA kernel and the peers, one process, eager, L2 flushed, bf16 (issue 20's forward rows):
``chunk_simple_gla`` B4 T4096 H16 K=V=128 (fla's shape) and ``mamba_chunk_scan_combined`` B1 T16384
and B4 T4096 (80 heads x 64, dstate 128, one group, chunk 256, D, dt_bias, dt_softplus). Each row's
output against the float32 PyTorch form (relative RMS). Variants of the sweep's launch shape
(``--sweep BV:warps:stages[:segN][:phN][:tma][:pwN][:regN][:hN][:grp][:calm][:qk][:gluon][:ws][:prR]``,
repeatable) beside the planner's; ``--profile``
adds GPU time by kernel.

    PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py \
        --out benchmarks/results/gpu_gla_sweep_<commit>.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch

import recurscan
from benchmarks import gpu_gla
from benchmarks.gpu_gla import SHAPES, SSD_SHAPES, inputs, ssd_inputs, time_impls
from recurscan.plan import gla as plan_gla
from recurscan.plan.delta import GluonTwinRow
from recurscan.plan.delta import DeltaShape


def parse_sweep(text: str) -> DeltaShape:
    """``BV:warps:stages[:segN][:phN][:tma][:pwN][:regN][:hN][:ghN][:grp][:calm][:qk][:gluon][:ws][:prR]`` -> a
    DeltaShape (pw: the prep's warps, reg: its register cap, 0 for none; h: value heads a prep program, cut to a
    divisor of the group by the planner's with_prep_heads; gh: the most value heads a group prep program takes,
    DeltaShape.group_prep_heads; grp: the group prep; calm: with its
    calm gates; qk: the group prep's coef alone, the sweep forming the scores (DeltaShape.sweep_scores);
    gluon: the sweep as its Gluon twin; ws: that twin warp-specialised (DeltaShape.specialized); pr:
    the phases' ratio, DeltaShape.phase_ratio)."""
    parts = text.split(":")
    fields = dict(segments=1, phases=1, tma_store=False)
    prep_warps = 4
    for p in parts[3:]:
        if p.startswith("seg"):
            fields["segments"] = int(p[3:])
        elif p.startswith("ph"):
            fields["phases"] = int(p[2:])
        elif p == "tma":
            fields["tma_store"] = True
        elif p.startswith("pw"):
            prep_warps = int(p[2:])
        elif p.startswith("reg"):
            fields["prep_maxnreg"] = int(p[3:]) or None
        elif p.startswith("gh"):
            fields["group_prep_heads"] = int(p[2:])
        elif p.startswith("h"):
            fields["prep_heads"] = int(p[1:])
        elif p == "grp":
            fields["group_prep"] = True
        elif p == "calm":
            fields["group_prep"] = fields["calm_gates"] = True
        elif p == "qk":
            fields["group_prep"] = fields["sweep_scores"] = True
        elif p == "gluon":
            fields["gluon_sweep"] = True
        elif p == "ws":
            fields["gluon_sweep"] = fields["specialized"] = True
        elif p.startswith("pr"):
            fields["phase_ratio"] = float(p[2:])
    bv = int(parts[0])
    return DeltaShape(bv, int(parts[1]), int(parts[2]), prep_warps, f"benchmark variant {text}", v_product=bv >= 64,
                      **fields)


def variants(sweeps):
    """(tag, how the planner is set) for the fused kernel, the planned sweep and each variant."""
    planned = plan_gla.gla_sweep_shape
    out = [("fused", dict(on=False, shape=planned)), ("sweep planned", dict(on=True, shape=planned))]
    for text in sweeps:
        shape = parse_sweep(text)
        out.append((f"sweep {text}", dict(on=True, shape=lambda problem, device, gluon=True, s=shape:
                                          plan_gla.with_prep_heads(s, problem))))
    return out


def rows_for(name, make_call, want, tagged, peers):
    rows = []
    for tag, how in tagged:
        plan_gla.SCALAR_ON_SWEEP, plan_gla.gla_sweep_shape = how["on"], how["shape"]
        rows += time_impls(f"{name} {tag}", {"recurscan triton": make_call}, want)
    plan_gla.SCALAR_ON_SWEEP, plan_gla.gla_sweep_shape = True, tagged[1][1]["shape"]
    return rows + time_impls(name, peers, want)


#: The parallel stage's programs an SM that the training rows also try (``--grads-waves``).
GRADS_WAVES: list[int] = []
#: The parallel stage's dg launches that the training rows also try (``--grads-dg``).
GRADS_DG: list[str] = []
#: The warps of dq's and dk's launches of their own that the training rows also try (``--grads-sides``).
GRADS_SIDES: list[int] = []
#: The reverse sweep's (value columns, warps) that the training rows also try (``--reverse-sweep BV:W``).
REVERSE_SWEEPS: list[str] = []
#: Whether SSD's training rows also run the recompute's sweep as the Gluon twin (``--recompute-twin``).
RECOMPUTE_TWIN = False
#: Whether SSD's training rows also run the backward's reverse sweep on the kernel not planned (``--reverse-twin``).
REVERSE_TWIN = False
#: Whether SSD's training rows also run the reverse sweep's twin in the form not planned, warp-specialised or
#: not (``--reverse-specialized``).
REVERSE_SPECIALIZED = False
#: Whether SSD's training rows also run the parallel stage's dg launch on the kernel not planned (``--dg-twin``).
DG_TWIN = False
#: Whether SSD's training rows also run the dg twin in the form not planned, warp-specialised or not
#: (``--dg-specialized``).
DG_SPECIALIZED = False
#: Whether the training rows (simple GLA's too) also run with the forward keeping the chunk states for the
#: backward, or without where that is planned (``--forward-states``, plan.gla.GLA_FORWARD_STATES).
FORWARD_STATES = False
#: Whether SSD's training rows also run with x's and dt's gradients formed in the reverse sweep, or
#: without where that is planned (``--ssd-grads``, plan.gla.GLA_REVERSE_SSD_GRADS).
FOLD_SSD_GRADS = False
#: Whether SSD's training rows also run with v = dt x formed in the parallel stage's factors, or by a
#: pass of its own where that is planned (``--v-from-x``, plan.gla.GLA_PARALLEL_V_FROM_X).
V_FROM_X = False
#: The shares of the SMs under which SSD's training rows also run the recompute beside the reverse sweep
#: (``--corun SHARE``, plan.gla.GLA_BACKWARD_CORUN).
CORUN: list[float] = []


#: The planner switches the training rows also run the other way from how they are planned, each
#: when its module switch above is set (its command-line flag sets it): plan.gla attribute (a
#: GluonTwinRow or a bool) -> (switch, flag, the form's name where the attribute is planned on,
#: where it is planned off).
FLIPS = {
    "GLUON_GLA_REVERSE_SWEEP": ("REVERSE_TWIN", "--reverse-twin", "the reverse sweep on the Triton kernel",
                                "the reverse sweep's Gluon twin"),
    "GLUON_GLA_REVERSE_SPECIALIZED": ("REVERSE_SPECIALIZED", "--reverse-specialized",
                                      "the reverse sweep's twin on one warpgroup",
                                      "the reverse sweep's twin warp-specialised"),
    "GLUON_GLA_DG_SPECIALIZED": ("DG_SPECIALIZED", "--dg-specialized", "the dg twin on eight warps",
                                 "the dg twin warp-specialised"),
    "GLUON_GLA_DG": ("DG_TWIN", "--dg-twin", "the dg launch on the Triton kernel", "the dg launch's Gluon twin"),
    "GLA_FORWARD_STATES": ("FORWARD_STATES", "--forward-states", "the chunk states recomputed",
                           "the chunk states kept by the forward"),
    "GLA_REVERSE_SSD_GRADS": ("FOLD_SSD_GRADS", "--ssd-grads", "x and dt after the reverse sweep",
                              "x and dt in the reverse sweep"),
    "GLA_PARALLEL_V_FROM_X": ("V_FROM_X", "--v-from-x", "v formed apart", "v formed in the parallel stage"),
}


def _flipped(attr: str) -> dict:
    """``{form name: {attr: value}}``: plan.gla's ``attr`` (:data:`FLIPS`) the other way from how it
    is planned, or nothing where its switch is not set."""
    switch, _, when_on, when_off = FLIPS[attr]
    if not globals()[switch]:
        return {}
    planned = getattr(plan_gla, attr)
    on = planned.on if isinstance(planned, GluonTwinRow) else planned
    value = dataclasses.replace(planned, on=not on) if isinstance(planned, GluonTwinRow) else not on
    return {f"recurscan triton, {when_on if on else when_off}": {attr: value}}


def training_forms() -> tuple[dict, dict]:
    """``(forms, common)`` of :func:`train_rows`: each form's name -> the plan.gla settings it runs
    with (attribute -> value), from the command line's variants; ``common``, the forms every
    training row runs (simple GLA's too), is part of ``forms``."""
    forms = {"recurscan triton": {}, "recurscan triton, the delta prep": dict(GROUP_PREP_MIN_HEADS=None),
             "recurscan triton, one value head a grads program": dict(GROUP_GRADS_MIN_HEADS=None),
             **{f"recurscan triton, grads at {w} programs an SM": dict(GROUP_GRADS_WAVES=w) for w in GRADS_WAVES},
             **{f"recurscan triton, dg launch {d}": dict(GROUP_GRADS_DG=None if d == "none" else
                                                         tuple(map(int, d.split(":")))) for d in GRADS_DG},
             **{f"recurscan triton, dq and dk apart on {w} warps": dict(GROUP_GRADS_SIDES=w) for w in GRADS_SIDES},
             **{f"recurscan triton, reverse sweep {r}": dict(REVERSE_SWEEP=tuple(map(int, r.split(":"))))
                for r in REVERSE_SWEEPS},
             **({"recurscan triton, the recompute's Gluon twin": dict(GLUON_GLA_RECOMPUTE_SWEEP=dataclasses.replace(
                 plan_gla.GLUON_GLA_RECOMPUTE_SWEEP, on=True))} if RECOMPUTE_TWIN else {}),
             **{name: settings for attr in FLIPS if attr != "GLA_FORWARD_STATES"
                for name, settings in _flipped(attr).items()},
             **{f"recurscan triton, the recompute beside the reverse sweep at {c}": dict(GLA_BACKWARD_CORUN=c)
                for c in CORUN}}
    # The forms every training row runs (simple GLA's too): the planned one, and the chunk states kept or not.
    common = {"recurscan triton": {}, **_flipped("GLA_FORWARD_STATES")}
    forms.update(common)
    return forms, common


def train_rows():
    """Forward + backward (every input's gradient, one fixed upstream gradient), eager, L2 flushed:
    the planner's form, and for SSD the same with the delta prep alone (no group prep), with one
    value head a program of the parallel stage, and with the group's heads split for
    :data:`GRADS_WAVES` programs an SM (plan.gla.GROUP_GRADS_WAVES), beside the peers that train here (mamba_ssm; fla's simple-GLA backward refuses on Triton 3.6 without
    TileLang)."""
    from benchmarks.gpu_gla import SSD_GRADS, time_train, train_step
    from benchmarks.runner import NotInstalled, load_mamba
    from recurscan.runtime.cache import clear_caches
    rows = []
    forms, common = training_forms()

    def timed(name, step, peers, variants=True):
        out = []
        for impl, overrides in (forms if variants else common).items():
            saved = {a: getattr(plan_gla, a) for a in overrides}
            for a, value in overrides.items():
                setattr(plan_gla, a, value)
            clear_caches()  # the launches are kept by signature, not by the planner's settings
            out += time_train(name, {impl: step})
            for a, value in saved.items():
                setattr(plan_gla, a, value)
        return out + time_train(name, peers)

    s = SHAPES["simple_gla_b4_t4096_h16"]
    q, k, v, g = inputs(s)
    dy = torch.randn_like(v)
    rows += timed("simple_gla_b4_t4096_h16", lambda: train_step(
        lambda *a: recurscan.chunk_simple_gla(*a, scale=s["scale"])[0], (q, k, v, g), {}, (0, 1, 2, 3), dy), {},
        variants=False)
    for name, (Bt, T) in SSD_SHAPES.items():
        a, kw = ssd_inputs(Bt, T)
        dy = torch.randn_like(a[0])
        peers = {}
        try:
            mamba = load_mamba("ssd_combined", "mamba_chunk_scan_combined")
            peers["mamba_ssm"] = lambda: train_step(mamba, a, kw, SSD_GRADS, dy)
        except NotInstalled as exc:
            rows.append(dict(shape=name, impl="mamba_ssm", status=f"not installed: {exc}"))
        rows += timed(name, lambda: train_step(recurscan.mamba_chunk_scan_combined, a, kw, SSD_GRADS, dy), peers)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--sweep", action="append", default=[])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--train", action="store_true", help="also forward + backward: the planner's form and SSD's "
                                                          "variants (train_rows), beside the peers")
    ap.add_argument("--grads-waves", type=int, action="append", default=[],
                    help="with --train: SSD's rows also with the parallel stage's group split for N programs an SM")
    ap.add_argument("--grads-dg", action="append", default=[],
                    help="with --train: SSD's rows also with the parallel stage's dg launch as HEADS:WARPS "
                         "(plan.gla.GROUP_GRADS_DG), or none: dg with dq and dk")
    ap.add_argument("--grads-sides", type=int, action="append", default=[],
                    help="with --train: SSD's rows also with dq and dk in launches of their own on N warps "
                         "(plan.gla.GROUP_GRADS_SIDES)")
    ap.add_argument("--reverse-sweep", action="append", default=[],
                    help="with --train: SSD's rows also with the backward's reverse sweep as BV:WARPS "
                         "(plan.gla.REVERSE_SWEEP)")
    ap.add_argument("--recompute-twin", action="store_true",
                    help="with --train: SSD's rows also with the recompute's sweep as its Gluon twin "
                         "(plan.gla.GLUON_GLA_RECOMPUTE_SWEEP)")
    ap.add_argument("--corun", type=float, action="append", default=[],
                    help="with --train: SSD's rows also with the recompute's sweep beside the reverse sweep where "
                         "its programs are at most this share of the SMs (plan.gla.GLA_BACKWARD_CORUN)")
    ap.add_argument("--train-only", action="store_true", help="the training rows alone")
    ap.add_argument("--gla", action="append", default=[], metavar="B:T:H",
                    help="also simple GLA at this batch, length and heads (K = V = 128)")
    ap.add_argument("--gla-only", action="store_true", help="the simple GLA rows alone (no SSD, no training)")
    for attr, (_, flag, when_on, when_off) in FLIPS.items():
        ap.add_argument(flag, action="store_true",
                        help=f"with --train: the training rows also with plan.gla.{attr} the other way from how it "
                             f"is planned ('{when_on}' where it is on, '{when_off}' where off)")
    args = ap.parse_args()
    GRADS_WAVES.extend(args.grads_waves)
    GRADS_DG.extend(args.grads_dg)
    GRADS_SIDES.extend(args.grads_sides)
    REVERSE_SWEEPS.extend(args.reverse_sweep)
    CORUN.extend(args.corun)
    global RECOMPUTE_TWIN
    RECOMPUTE_TWIN = args.recompute_twin
    for switch, flag, _, _ in FLIPS.values():
        globals()[switch] = getattr(args, flag[2:].replace("-", "_"))
    gpu_gla.PROFILE = args.profile
    if args.train_only:
        save(args.out, train_rows())
        return
    tagged = variants(args.sweep)
    rows = []
    gla_shapes = {"simple_gla_b4_t4096_h16": SHAPES["simple_gla_b4_t4096_h16"]}
    for text in args.gla:
        B, T, H = map(int, text.split(":"))
        gla_shapes[f"simple_gla_b{B}_t{T}_h{H}"] = dict(B=B, T=T, H=H, HV=H, K=128, V=128, scale=None)
    for name, s in gla_shapes.items():
        rows += gla_rows(name, s, tagged)
    if args.gla_only:
        save(args.out, rows)
        return
    from benchmarks.runner import NotInstalled, load_mamba
    for name, (Bt, T) in SSD_SHAPES.items():
        a, kw = ssd_inputs(Bt, T)
        want = recurscan.mamba_chunk_scan_combined(*(t.float() for t in a), **kw, backend="torch")
        peers = {}
        try:
            mamba = load_mamba("ssd_combined", "mamba_chunk_scan_combined")
            peers["mamba_ssm"] = lambda: mamba(*a, **kw)
        except NotInstalled as exc:
            rows.append(dict(shape=name, impl="mamba_ssm", status=f"not installed: {exc}"))
        rows += rows_for(name, lambda: recurscan.mamba_chunk_scan_combined(*a, **kw), want, tagged, peers)
    save(args.out, rows)  # the forward rows now, so that a time limit on the training rows keeps them
    if args.train:
        rows += train_rows()
        save(args.out, rows)


def gla_rows(name, s, tagged):
    """simple GLA at ``s`` (gpu_gla.SHAPES' form): the fused kernel, the planned sweep, each variant,
    and fla's."""
    q, k, v, g = inputs(s)
    want = recurscan.chunk_simple_gla(*(x.float() for x in (q, k, v)), g, scale=s["scale"], backend="torch")[0]
    peers, rows = {}, []
    try:
        from fla.ops.simple_gla import chunk_simple_gla as fla_gla
        peers["fla"] = lambda: fla_gla(q, k, v, g, scale=s["scale"])[0]
    except Exception as exc:  # recorded, never hidden
        rows.append(dict(shape=name, impl="fla", status=f"not installed: {exc}"))
    return rows + rows_for(name, lambda: recurscan.chunk_simple_gla(q, k, v, g, scale=s["scale"])[0], want, tagged,
                           peers)


def save(path, rows):
    if path:
        json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(),
                       commit=os.environ.get("RECURSCAN_COMMIT"), rows=rows), open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
