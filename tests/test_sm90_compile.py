"""Every launch of the delta-rule backward (its forward recompute included) compiles for sm_90 with
no GPU, exactly as the launch layer builds it (tests/helpers/sm90.py, in a process of its own
without the interpreter): some kernels that run under the interpreter fail Triton's GPU lowering
(a branch on a scalar inside a loop did, in the parallel stage), and a kernel argument left to its
default reaches the GPU's first call only. Each must also fit the H200's shared memory."""
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.sm90 import CASES, SHAPES, SWEEP_SHAPES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Compiler:
    """tests/helpers/sm90.py serving compiles in a process of its own without the interpreter,
    started on the first request of this test process and kept for the rest: its imports (~4 s)
    once rather than once a test."""

    process = None

    @classmethod
    def run(cls, argv, timeout=600):
        import json
        import select
        from types import SimpleNamespace

        from tests.helpers.sm90 import ANSWER
        if cls.process is None or cls.process.poll() is not None:
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
            cls.process = subprocess.Popen([sys.executable, "-m", "tests.helpers.sm90", "serve"], cwd=ROOT, env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        cls.process.stdin.write(json.dumps(list(argv)) + "\n")
        cls.process.stdin.flush()
        while True:
            ready, _, _ = select.select([cls.process.stdout], [], [], timeout)
            line = cls.process.stdout.readline() if ready else ""
            if not line:  # timed out, or the process ended: the next request starts another
                cls.process.kill()
                cls.process = None
                return SimpleNamespace(returncode=1, stdout="", stderr=f"sm90 compile process: no answer to {argv}")
            if line.startswith(ANSWER):
                return SimpleNamespace(**json.loads(line[len(ANSWER):]))


def compile_offline(*argv):
    """tests/helpers/sm90.py's lines for ``argv`` (its command line), compiled without the
    interpreter: an object with its ``returncode``, ``stdout`` and ``stderr``."""
    return _Compiler.run(argv)


#: The Gluon twins' cases: each takes GDN (M = 1), GVA too; the reverse sweep Gated Delta Product at M = 2.
GLUON_CASES = {"Gluon reverse sweep": ("GDN dense, H = HV", "GDN varlen, GVA", "GDP M 2 varlen"),
               "Gluon dq and dk": ("GDN dense, H = HV", "GDN varlen, GVA"),
               "Gluon dq and dk, four stages": ("GDN dense, H = HV", "GDN varlen, GVA"),
               "Gluon scores": ("GDN dense, H = HV", "GDN varlen, GVA"),
               "Gluon dq and dk, warp-specialised": ("GDN dense, H = HV", "GDN varlen, GVA"),
               "Gluon forward sweep": ("GDN varlen, GVA",),
               "Gluon forward sweep, checkpoints": ("GDN dense, H = HV",),
               "Gluon recompute, warp-specialised": ("GDN dense, H = HV", "GDN varlen, GVA"),
               "Gluon recompute, warp-specialised, phases": ("GDN dense, H = HV",)}


@pytest.mark.parametrize("case, shape", [(c, s) for c in CASES for s in SHAPES if c in GLUON_CASES.get(s, CASES)])
def test_every_backward_launch_compiles_for_sm90(case, shape):
    """The Gluon twins also without spills: the Gluon rules (docs/kernels-gluon.md)."""
    run = compile_offline(case, shape)
    assert run.returncode == 0, run.stderr[-3000:]
    sweep = "gluon_bwd_sweep_kernel" if shape == "Gluon reverse sweep" else "chunk_delta_bwd_sweep_kernel"
    assert sweep in run.stdout, run.stdout
    if shape.startswith("Gluon forward sweep"):  # the recompute on the forward sweep's twin
        assert "gluon_sweep_kernel" in run.stdout and "chunk_delta_sweep_kernel" not in run.stdout, run.stdout
    if shape.startswith("Gluon recompute"):  # on its warp-specialised form
        assert "gluon_gla_sweep_specialized_kernel" in run.stdout and "chunk_delta_sweep_kernel" not in run.stdout, \
            run.stdout
    if shape.startswith("Gluon dq and dk") and "warp-specialised" not in shape:
        assert "gluon_bwd_dqdk_kernel" in run.stdout and "chunk_delta_bwd_dqdk_kernel" not in run.stdout, run.stdout
    if shape == "Gluon dq and dk, warp-specialised":
        assert "gluon_bwd_dqdk_specialized_kernel" in run.stdout, run.stdout
    if shape == "Gluon scores":
        assert "gluon_bwd_scores_specialized_kernel" in run.stdout, run.stdout
        assert "chunk_delta_bwd_scores_kernel" not in run.stdout, run.stdout


@pytest.mark.parametrize("case", GLUON_CASES["Gluon scores"])
def test_the_gluon_scores_kernel_compiles_at_k64(case):
    """The warp-specialised scores kernel holds its sums, Q K^T, K K^T and the gate tile within 240
    registers a thread with two registers to spare at K = 128 (nvdisasm's live ranges): at K = V = 64
    too, without spills."""
    run = compile_offline(case, "Gluon scores", "64")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_bwd_scores_specialized_kernel" in run.stdout, run.stdout


def test_the_gluon_reverse_sweep_compiles_for_gdp_at_k64():
    """The reverse sweep's Gluon twin for Gated Delta Product (M = 2: q, dO and aqk's query rows by
    token) at K = 64 too, without spills (the planner takes K = 128 alone until its GPU test runs)."""
    run = compile_offline("GDP M 2 varlen", "Gluon reverse sweep", "64", "128")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_bwd_sweep_kernel" in run.stdout, run.stdout


@pytest.mark.parametrize("case, dims", [("GDP M 2 dense, H = HV", ()), ("GDP M 2 varlen, H = HV", ()),
                                        ("GDP M 2 varlen, H = HV", ("64", "128"))], ids=["dense", "varlen", "K 64"])
def test_the_gluon_dq_dk_kernel_compiles_for_gdp(case, dims):
    """dq and dk's Gluon twin at M = 2 (Gated Delta Product, one value head a q/k head: the query
    rows by token, first in their tiles), dense and varlen, K 128 and 64, without spills."""
    run = compile_offline(case, "Gluon dq and dk", *dims)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_bwd_dqdk_kernel" in run.stdout and "chunk_delta_bwd_dqdk_kernel" not in run.stdout, run.stdout


@pytest.mark.parametrize("case, dims", [("GDP M 2 dense, H = HV", ()), ("GDP M 2 varlen", ()),
                                        ("GDP M 2 dense, H = HV", ("64",))], ids=["dense", "varlen, GVA", "K = V = 64"])
def test_the_gluon_scores_kernel_compiles_for_gdp(case, dims):
    """The warp-specialised scores kernel at M = 2 (Gated Delta Product: a chunk's rows copy-major,
    the query's copy first), dense and varlen with GVA, K = V = 128 and 64, without spills."""
    run = compile_offline(case, "Gluon scores", *dims)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_bwd_scores_specialized_kernel" in run.stdout, run.stdout


@pytest.mark.parametrize("case, dims", [("GDN varlen, H = HV", ()), ("GDN dense, H = HV", ("64", "128")),
                                        ("GDN varlen, GVA", ("64", "128"))],
                         ids=["varlen", "K 64", "K 64, GVA"])
def test_the_warp_specialised_dq_dk_kernel_compiles_varlen_and_at_k64(case, dims):
    """dq and dk's warp-specialised kernel on a varlen batch with one value head a q/k head, and at
    K = 64 (V = 128: the twin's scope wants three 32-column steps), also summing a GVA group of two,
    without spills (at K = 128 the GVA group's slot takes 226248 B of the 227 KB)."""
    run = compile_offline(case, "Gluon dq and dk, warp-specialised", *dims)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_bwd_dqdk_specialized_kernel" in run.stdout, run.stdout


@pytest.mark.parametrize("family", ["gla", "gla-chunk-states", "gla-per-key", "gla-split", "ssd", "ssd-cache",
                                    "ssd-seq-idx", "ssd-split", "gla-backward", "gla-per-key-backward",
                                    "gla-sweep-backward", "gla-group-sweep-backward", "gla-group-sweep-twin-backward",
                                    "ssd-group-grads-backward", "ssd-group-grads-sides-backward",
                                    "ssd-group-grads-twin-backward"])
@pytest.mark.parametrize("case", [c for c, (M, _) in CASES.items() if M == 1])
def test_the_gla_forward_compiles_for_sm90(case, family):
    run = compile_offline(family, case)
    assert run.returncode == 0, run.stderr[-3000:]
    if family == "gla-sweep-backward":  # the recompute on the delta sweep
        assert "chunk_delta_prep_kernel" in run.stdout and "chunk_delta_sweep_kernel" in run.stdout, run.stdout
    elif family == "gla-group-sweep-twin-backward":  # there the forward sweep's Gluon twin, outputs off,
        # and the reverse sweep's Gluon twin
        assert "chunk_group_prep_kernel" in run.stdout and "gluon_sweep_kernel" in run.stdout, run.stdout
        assert "gluon_gla_bwd_sweep_kernel" in run.stdout, run.stdout
        assert "chunk_delta_sweep_kernel" not in run.stdout and "chunk_simple_gla_bwd_sweep_kernel" not in run.stdout
    elif family == "ssd-group-grads-twin-backward":  # SSD's group with every backward twin: the dg launch's too
        assert "gluon_gla_bwd_sweep_kernel" in run.stdout and "gluon_gla_bwd_dg_kernel" in run.stdout, run.stdout
        assert "chunk_simple_gla_bwd_sweep_kernel" not in run.stdout, run.stdout
    elif family.startswith(("gla-group-sweep", "ssd-group-grads")):  # there on the group prep, read by the
        # reverse sweep; SSD's: a group's value heads summed in the parallel stage's programs
        assert "chunk_group_prep_kernel" in run.stdout and "chunk_delta_sweep_kernel" in run.stdout, run.stdout
    else:
        assert "chunk_simple_gla_fwd_kernel" in run.stdout, run.stdout
    if family in ("gla-per-key", "gla-split", "ssd-split"):
        assert "chunk_gla_prep_kernel" in run.stdout, run.stdout
    if family.endswith("backward"):
        assert "chunk_simple_gla_bwd_grads_kernel" in run.stdout, run.stdout
    if family == "gla-per-key-backward":
        assert "chunk_gla_prep_kernel" in run.stdout, run.stdout


@pytest.mark.parametrize("family, shape, case",
                         [("ssd-sweep", shape, "GDN varlen, GVA") for shape in SWEEP_SHAPES] +  # every SSD flag
                         [("ssd-sweep", "one pass", "GDN dense, H = HV"), ("gla-sweep", "one pass", "GDN dense, H = HV"),
                          ("gla-sweep", "narrow", "GDN varlen, GVA"), ("gla-sweep", "group prep", "GDN varlen, GVA"),
                          ("gla-per-key-sweep", "one pass", "GDN dense, H = HV"),
                          ("gla-per-key-sweep", "segments", "GDN varlen, GVA")])
def test_gla_and_ssd_on_the_delta_sweep_compile_for_sm90(case, shape, family):
    run = compile_offline(family, case, shape)
    assert run.returncode == 0, run.stderr[-3000:]
    prep = "chunk_gla_prep_kernel" if family == "gla-per-key-sweep" else \
        "chunk_group_prep_kernel" if shape.startswith("group prep") else "chunk_delta_prep_kernel"
    assert prep in run.stdout and "chunk_delta_sweep_kernel" in run.stdout, run.stdout


def test_the_gluon_prep_prototype_compiles_for_sm90_without_spills():
    """benchmarks/gluon_prep_proto.py (GPU only; its outputs are compared with the Triton prep's on
    the GPU by the benchmark itself) compiles for sm_90 within the H200's shared memory in each of its
    VECTORS forms, without spills where no register cap is set (at the Triton prep's cap of 168,
    which gives three programs an SM, a few bytes spill: recorded, not asserted)."""
    run = compile_offline("gluon-prep-proto")
    assert run.returncode == 0, run.stderr[-3000:]
    for vectors in (0, 1, 2):
        line = next(x for x in run.stdout.splitlines() if f"gluon_prep_kernel, maxnreg -, vectors {vectors}:" in x)
        assert "STACK:0 " in line, line
        assert f"gluon_prep_kernel, maxnreg 168, vectors {vectors}:" in run.stdout, run.stdout


@pytest.mark.parametrize("form", ["fused-prefill", "fused-prefill-pipelined"], ids=["planned", "FUSED_PIPELINED"])
def test_the_fused_prefill_compiles_for_sm90_without_spills(form):
    """The fused prefill's launches (launch/delta_fused.py) as the launch layer builds them, dense and
    varlen with GVA, with an initial and final state and serving a bf16 cache: the chunk vectors' pass,
    the warp-specialised Gluon kernel within the H200's shared memory and 512 threads at 128 registers
    without spills, its wgmmas serialised as planned and pipelined with plan.delta.FUSED_PIPELINED
    (compiled_line's Gluon rules, WGMMA_SERIALIZED), and the flagged token loop."""
    run = compile_offline(form)
    assert run.returncode == 0, run.stderr[-3000:]
    for case in ("fused, GDN dense, H = HV", "fused, GDN varlen, GVA", "fused serving, GDN dense, H = HV",
                 "fused serving, GDN varlen, GVA"):
        for kernel in ("chunk_vectors_kernel", "gluon_fused_prefill_kernel", "streaming_recurrence_kernel"):
            assert f"{case}: {kernel}: shared" in run.stdout, run.stdout
        line = next(x for x in run.stdout.splitlines() if f"{case}: gluon_fused_prefill_kernel" in x)
        spills = re.findall(r"(\d+) local ld/st", line)
        assert "STACK:0 " in line and spills and set(spills) == {"0"}, line


@pytest.mark.parametrize("probe", ["0", "1", "2", "3", "4", "5"])
def test_the_fused_prefill_forms_and_probes_compile_without_spills_in_their_loops(probe):
    """The fused prefill's kernel with plan.delta.FUSED_DIAGONAL_FROM_PASS on and off, under each
    timing probe (RECURSCAN_FUSED_PROBE; benchmarks/gpu_fused_probe.py runs each in a process of its
    own): compiled for sm_90, no local loads or stores in any partition's loop (the chains' two,
    but under probe 5 where they hold no product, and the prep's, but under probe 4), within the
    H200's shared memory; the pass with the diagonal inverses without spills. Probe 5 (no chain
    work) is the planned form's only: the other form's prep spills there. The planned form's
    no-stack rule is test_the_fused_prefill_compiles_for_sm90_without_spills's."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "RECURSCAN_FUSED_PROBE": probe})
    run = subprocess.run([sys.executable, "-m", "tests.helpers.sm90", "fused-prefill-forms"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    for d_pass in (True,) if probe == "5" else (True, False):
        line = next(x for x in run.stdout.splitlines()
                    if x.startswith(f"fused D_FROM_PASS {d_pass}, probe {probe}: gluon_fused_prefill_kernel:"))
        loops = re.findall(r"loop: (\d+) instructions, \d+ barriers, (\d+) HGMMA or HMMA, (\d+) local ld/st", line)
        assert len(loops) == {"4": 2, "5": 1}.get(probe, 3), line
        assert all(spills == "0" for _, _, spills in loops), line
    line = next(x for x in run.stdout.splitlines() if x.startswith(f"fused D_FROM_PASS True, probe {probe}: "
                                                                   "chunk_vectors_kernel:"))
    assert "STACK:0 " in line, line


def test_the_gluon_forward_sweep_compiles_for_sm90():
    """The forward sweep's Gluon twin in every pass and form it takes (the single pass, phases, a
    segmented sweep's second pass; dense and varlen; a cache with float32 chunk states; the WY step
    off for SSD and simple GLA, on the delta prep and on the group prep's scores, there in one pass
    and in segments; warp-specialised, also keeping the chunk states in bf16, and with the WY step),
    without spills: the Gluon rules (docs/kernels-gluon.md)."""
    run = compile_offline("gluon-forward")
    assert run.returncode == 0, run.stderr[-3000:]
    for form in ("one pass", "phases", "segments", "serving"):
        assert f"{form}, GDN dense, H = HV: gluon_sweep_kernel" in run.stdout, run.stdout
    assert "segments, GDN dense, H = HV: chunk_delta_sweep_kernel" in run.stdout  # its first pass, and the replay
    for form in ("SSD one pass, D per head", "SSD one pass, D per channel", "SSD phases, D per head",
                 "SSD phases, D per channel", "GLA one pass, GDN dense, H = HV", "GLA one pass, GDN varlen, GVA",
                 "SSD group prep, 2 stages", "SSD group prep, 3 stages", "SSD group prep, segments"):
        assert f"{form}: gluon_sweep_kernel" in run.stdout, run.stdout
    assert "SSD group prep, segments: chunk_delta_sweep_kernel" in run.stdout  # its first pass, and the replay
    for d in ("head", "channel"):  # the warp-specialised form; its replay the Triton kernel's, without its cap
        assert f"SSD group prep, warp-specialised, D per {d}: gluon_gla_sweep_specialized_kernel" in run.stdout
    for case in ("GDN dense, H = HV", "GDN varlen, GVA"):  # the same, forming the scores itself
        assert (f"GLA warp-specialised, scores in the sweep, {case}: gluon_gla_sweep_specialized_kernel"
                in run.stdout), run.stdout
        assert f"GLA warp-specialised, scores in the sweep, {case}: chunk_delta_sweep_kernel" in run.stdout  # replay
    assert "SSD group prep, warp-specialised, in phases: gluon_gla_sweep_specialized_kernel" in run.stdout
    for kernel in ("chunk_group_prep_kernel", "gluon_gla_sweep_specialized_kernel"):
        assert f"SSD group prep, warp-specialised, 10 groups, dstate 64: {kernel}" in run.stdout, run.stdout
    assert "SSD warp-specialised, scores in the sweep: gluon_gla_sweep_specialized_kernel" in run.stdout
    for form in ("SSD warp-specialised", "SSD warp-specialised, in phases", "SSD warp-specialised, scores in the sweep",
                 "GLA warp-specialised, scores in the sweep, GDN varlen, GVA"):  # keeping the chunk states
        assert f"{form}, chunk states: gluon_gla_sweep_specialized_kernel" in run.stdout, run.stdout
    for form in ("one pass, GDN dense, H = HV", "one pass, GDN varlen, GVA", "phases, GDN dense, H = HV",
                 "serving, GDN varlen, GVA"):  # warp-specialised with the WY step; serving with bf16 chunk states
        assert f"WY warp-specialised {form}: gluon_gla_sweep_specialized_kernel" in run.stdout, run.stdout
    for kernel in ("gluon_gla_sweep_specialized_kernel", "chunk_delta_prep_kernel"):  # the chained schedule's pair
        assert f"WY warp-specialised chained, GDN dense, H = HV: {kernel}" in run.stdout, run.stdout


def test_the_ssd_training_gate_kernels_compile_for_sm90():
    run = compile_offline("ssd-gate")
    assert run.returncode == 0, run.stderr[-3000:]
    for kernel, count in (("ssd_gate_fwd_kernel", 1), ("ssd_gate_bwd_kernel", 1), ("ssd_step_bwd_kernel", 2),
                          ("ssd_value_kernel", 1)):
        assert run.stdout.count(kernel) == count, run.stdout


def test_the_descriptor_kernel_compiles_for_sm90():
    run = compile_offline("descriptors")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("chunk_descriptors_kernel") == 4, run.stdout


def test_the_resource_report_compiles_the_forward_as_the_launch_layer_builds_it():
    """benchmarks/sm90_resources.py's --sweep (its sweep variants through launch/delta.py, which
    its hand-written signatures had drifted from): every kernel's registers and shared memory."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-m", "benchmarks.sm90_resources", "--sweep", "64:4:3:1:1"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for kernel in ("chunk_delta_prep_kernel", "chunk_delta_sweep_kernel"):
        assert f"{kernel}: shared" in run.stdout and "REG:" in run.stdout, run.stdout


@pytest.mark.parametrize("ssd_grads", [None, "D per head", "D per channel", "no D"])
@pytest.mark.parametrize("case", ["GDN dense, H = HV", "GDN varlen, GVA"])
def test_the_warp_specialised_reverse_sweep_compiles_for_sm90(case, ssd_grads):
    """kernels/gluon/gla_backward_sweep_specialized.py as the launch layer builds it
    (GlaShape.reverse_specialized), dense and varlen, and forming SSD's x, dt and D gradients
    (SSD_GRADS; the Triton kernel's form of the flag too, where the twin is off): no spills, its
    shared memory within the H200's, its 16 warps under the register cap within 64 K
    (tests/helpers/sm90.compiled_line)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", "from tests.helpers import sm90; print(sm90.compile_gla_backward("
                          f"{case!r}, on_sweep=True, group_prep=True, recompute_twin=True, "
                          f"reverse_specialized=True, ssd_grads={ssd_grads!r}))"
                          + ("" if ssd_grads is None else "; print(sm90.compile_gla_backward("
                             f"{case!r}, on_sweep=True, group_prep=True, ssd_grads={ssd_grads!r}))")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_gla_bwd_sweep_specialized_kernel" in run.stdout, run.stdout
    if ssd_grads is not None:
        assert "chunk_simple_gla_bwd_sweep_kernel" in run.stdout, run.stdout


@pytest.mark.parametrize("case", ["GDN dense, H = HV", "GDN varlen, GVA"])
def test_the_warp_specialised_dg_launch_compiles_for_sm90(case):
    """kernels/gluon/gla_backward_dg_specialized.py as the launch layer builds it
    (GlaShape.dg_specialized; SSD's form, 16 value heads a query/key head), dense and varlen: no
    spills, its shared memory within the H200's, its 12 warps under the register cap within 64 K
    (tests/helpers/sm90.compiled_line)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", "from tests.helpers import sm90; print(sm90.compile_gla_backward("
                          f"{case!r}, on_sweep=True, group_prep=True, group_grads=True, recompute_twin=True, "
                          "dg_specialized=True))"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gluon_gla_bwd_dg_specialized_kernel" in run.stdout, run.stdout


@pytest.mark.parametrize("dg", ["twin", "warp-specialised"])
@pytest.mark.parametrize("case", ["GDN dense, H = HV", "GDN varlen, GVA"])
def test_the_parallel_stage_forming_v_from_x_compiles_for_sm90(case, dg):
    """SSD's backward with the chunk states kept and x's and dt's gradients in the reverse sweep
    (warp-specialised, SSD_GRADS), so that the parallel stage reads x and dt for v = dt x
    (V_FROM_X): dq's and dk's Triton launches and the dg launch's Gluon twin or its warp-
    specialised form, without spills (the Gluon rules), as the launch layer builds them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", "from tests.helpers import sm90; print(sm90.compile_gla_backward("
                          f"{case!r}, on_sweep=True, group_prep=True, group_grads=True, recompute_twin=True, "
                          f"reverse_specialized=True, dg_specialized={dg != 'twin'}, ssd_grads='D per head', "
                          "states_given=True))"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    kernel = "gluon_gla_bwd_dg_kernel" if dg == "twin" else "gluon_gla_bwd_dg_specialized_kernel"
    for name in (kernel, "gluon_gla_bwd_sweep_specialized_kernel", "chunk_simple_gla_bwd_grads_kernel"):
        assert name in run.stdout, run.stdout
    assert "chunk_delta_sweep_kernel" not in run.stdout and "gluon_sweep_kernel" not in run.stdout  # no recompute


PROBE_COMPILES = {
    "forward": "import dataclasses; from tests.helpers import sm90; print(sm90.compile_ssd_benchmark("
               "dataclasses.replace(sm90.SWEEP_SHAPES['group prep'], num_stages=3, gluon_sweep=True, "
               "specialized=True)))",
    "reverse": "from tests.helpers import sm90; print(sm90.compile_gla_backward('GDN dense, H = HV', on_sweep=True, "
               "group_prep=True, group_grads=True, recompute_twin=True))",
    "delta reverse": "from tests.helpers import sm90; print(sm90.compile_case('GDN dense, H = HV', 'Gluon reverse "
                     "sweep')); print(sm90.compile_case('GDP M 2 varlen', 'Gluon reverse sweep'))",
}


@pytest.mark.parametrize("value, count", [("1", 1), ("0", 0)], ids=["prefetch on (default)", "prefetch off"])
def test_the_warp_specialised_sweeps_prefetch_their_coef_blocks(value, count):
    """COEF_PREFETCH (kernels/gluon/gla_sweep_specialized.py): the planned SSD forward sweep's and
    the warp-specialised reverse sweep's load warps issue one bulk L2 prefetch a chunk (one in the
    PTX, in the load warp's loop), and none with ``RECURSCAN_SWEEP_COEF_PREFETCH=0``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "RECURSCAN_SWEEP_COEF_PREFETCH": value})
    describe = "lambda ck: f'{ck.name}: {ck.asm[\"ptx\"].count(\"cp.async.bulk.prefetch.L2\")}'"
    run = subprocess.run([sys.executable, "-c", "from tests.helpers import sm90; from recurscan.plan import gla; "
                          f"d = {describe}; print(sm90.compile_ssd_benchmark(gla.GLA_SWEEP_LAUNCH[0][1], describe=d)); "
                          "print(sm90.compile_gla_backward('GDN dense, H = HV', on_sweep=True, group_prep=True, "
                          "recompute_twin=True, reverse_specialized=True, describe=d))"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for kernel in ("gluon_gla_sweep_specialized_kernel", "gluon_gla_bwd_sweep_specialized_kernel"):
        assert f"{kernel}: {count}" in run.stdout, run.stdout


@pytest.mark.parametrize("variable, value, kernel", [
    ("RECURSCAN_SWEEP_PROBE", "1", "forward"), ("RECURSCAN_SWEEP_PROBE", "2", "forward"),
    ("RECURSCAN_SWEEP_PROBE", "3", "forward"), ("RECURSCAN_REVERSE_PROBE", "1", "reverse"),
    ("RECURSCAN_REVERSE_PROBE", "2", "reverse"), ("RECURSCAN_SWEEP_COEF_PREFETCH", "0", "forward"),
    ("RECURSCAN_DELTA_REVERSE_PROBE", "1", "delta reverse"), ("RECURSCAN_DELTA_REVERSE_PROBE", "3", "delta reverse"),
    ("RECURSCAN_DELTA_REVERSE_PROBE", "6", "delta reverse")])
def test_the_timing_probes_compile_for_sm90(variable, value, kernel):
    """The warp-specialised forward sweep's and the reverse sweep's timing probes (the benchmarks'
    --probe, each in a process of its own), and the forward sweep without its coef prefetch (the
    A/B's other side), compile without spills or shared-memory overflow."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), variable: value})
    run = subprocess.run([sys.executable, "-c", PROBE_COMPILES[kernel]], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert {"forward": "gluon_gla_sweep_specialized_kernel", "reverse": "gluon_gla_bwd_sweep_kernel",
            "delta reverse": "gluon_bwd_sweep_kernel"}[kernel] in run.stdout, run.stdout


@pytest.mark.parametrize("variable, module", [("RECURSCAN_SWEEP_PROBE", "gla_sweep_specialized"),
                                              ("RECURSCAN_REVERSE_PROBE", "gla_backward_sweep"),
                                              ("RECURSCAN_DELTA_REVERSE_PROBE", "delta_backward_sweep"),
                                              ("RECURSCAN_SWEEP_COEF_PREFETCH", "gla_sweep_specialized"),
                                              ("RECURSCAN_FUSED_PROBE", "delta_fused")])
def test_a_timing_probe_it_does_not_know_is_refused(variable, module):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **{variable: "7"})
    run = subprocess.run([sys.executable, "-c", f"import recurscan.kernels.gluon.{module}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and f"ValueError: {variable}" in run.stderr, run.stderr[-2000:]
