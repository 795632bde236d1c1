"""The benchmark runner's bookkeeping: registered workloads, FLOP and byte counts against figures
worked out by hand, and the JSON record's fields. No timing is asserted."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import registry, runner


def test_registered_workloads():
    expected = {"gdn_b1_t16384_h16_hv32", "gdn_b1_t65536_h16_hv32", "gdn_b4_t4096_h16", "gdn_b4_t8192_h16_hv64",
                "gdn_varlen16_32976_hv32", "gdp_m2_b4_t4096_h16", "gdn_decode_256", "gdn_decode_1024",
                "ssd_decode_256", "cpu_gdn_b1_t4096_h16"}
    assert expected <= set(registry.REGISTRY)
    w = registry.get("gdn_varlen16_32976_hv32")
    assert w.num_sequences == 16 and w.tokens == 32976 and w.varlen and w.batch == 1
    with pytest.raises(KeyError, match="unknown workload"):
        registry.get("no_such_workload")


def test_gdn_chunk_flops_per_token_head():
    # One window of 64 tokens, K = V = 128, per value head:
    #   K K^T, T X, Q K^T, (G o QK^T) v_new: 4 x 2*64*64*128 = 4,194,304
    #   K S, Q S, K^T v_new:                 3 x 2*64*128*128 = 6,291,456
    #   unit lower-triangular inverse:       64 * (64^2 - 1) / 3 = 87,360
    per_window = 4 * 2 * 64 * 64 * 128 + 3 * 2 * 64 * 128 * 128 + 87_360
    assert registry.chunk_window_flops(64, 64, 128, 128) == per_window == 10_573_120
    assert per_window // 64 == 165_205  # PERF-NOTES: ~164 kFLOP per token per value head, + the solve


def test_cpu_workload_counts_by_hand():
    w = registry.get("cpu_gdn_b1_t4096_h16")  # B1 T4096 H = HV = 16, K = V = 128, float32
    assert w.tokens == 4096
    assert w.flops() == 10_573_120 * 64 * 16  # 64 windows x 16 heads
    by_hand = (4 * 4096 * 16 * 128 * 4  # q, k, v read and o written, float32
               + 4096 * 16 * 4          # g, float32
               + 4096 * 16 * 4          # beta, float32
               + 16 * 128 * 128 * 4)    # final state written (no initial state)
    assert w.hbm_bytes() == by_hand == 135_790_592


def test_gpu_workload_bytes_per_token_head():
    # bf16 q, k, v, o (256 B each per token-head at 128) + g fp32 + beta bf16: PERF-NOTES' ~1.03 KB floor.
    w = registry.get("gdn_b4_t4096_h16")
    parts = w.byte_breakdown()
    per = (parts["q"] + parts["k"] + parts["v"] + parts["g"] + parts["beta"] + parts["o"]) / (w.tokens * 16)
    assert per == 4 * 256 + 4 + 2
    # A partial last window counts its own rows: 246 tokens = 3 full windows + 54.
    assert sum(registry.chunk_window_flops(c, c, 128, 128) for c in (64, 64, 64, 54)) * 32 == \
        registry.Workload("x", "gdn", (246,), heads=16, value_heads=32).flops()


def test_decode_counts():
    w = registry.get("gdn_decode_256")
    state = 256 * 32 * 128 * 128 * 4
    parts = w.byte_breakdown()
    assert parts["state_read"] == parts["state_written"] == state
    assert w.flops() == 7 * 128 * 128 * 32 * 256
    s = registry.get("ssd_decode_256")
    assert s.byte_breakdown()["state_read"] == 256 * 80 * 64 * 128 * 4
    assert s.flops() == 5 * 64 * 128 * 80 * 256


def test_gdp_query_rows():
    # M = 2: every window of 64 expanded rows holds 32 token reads.
    w = registry.get("gdp_m2_b4_t4096_h16")
    windows = 4 * 4096 * 2 // 64
    assert w.flops() == windows * 16 * registry.chunk_window_flops(64, 32, 128, 128)


def test_make_inputs_shapes_and_determinism():
    w = registry.get("cpu_gdn_smoke")
    a, b = w.make_inputs("cpu", seed=3), w.make_inputs("cpu", seed=3)
    assert a["q"].shape == (1, 200, 2, 32) and a["v"].shape == (1, 200, 4, 32) and a["g"].shape == (1, 200, 4)
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["g"], b["g"])
    assert (a["g"] < 0).all() and ((a["beta"] > 0) & (a["beta"] < 1)).all()
    v = registry.Workload("v", "gdn", (5, 1, 70), heads=1, value_heads=2, head_k=8, head_v=8, varlen=True,
                          dtype="float32", device="cpu")
    assert v.make_inputs("cpu")["cu_seqlens"].tolist() == [0, 5, 6, 76]


def _fake_peer(name, role="peer", fail=None):
    import recurscan

    def load(w):
        if fail:
            raise fail

        def fn(x):
            return recurscan.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                                                    use_qk_l2norm_in_kernel=x["use_qk_l2norm_in_kernel"])
        return fn
    return runner.Impl(name, role, load, "test double")


def test_runner_record_fields(tmp_path):
    rec = runner.run_workload(
        "cpu_gdn_smoke", device="cpu", impls=["recurscan"], warmup=0, repeats=2,
        extra_impls=[_fake_peer("same_op"), _fake_peer("absent", fail=runner.NotInstalled("import absent failed"))])
    json.dumps(rec)  # serialisable as is
    assert rec["workload"]["flops"] == registry.get("cpu_gdn_smoke").flops()
    assert rec["workload"]["hbm_bytes"] == registry.get("cpu_gdn_smoke").hbm_bytes()
    env = rec["environment"]
    for key in ("device_name", "cpu_model", "cpu_cores", "torch_threads", "git", "python", "torch", "triton",
                "timestamp_utc"):
        assert key in env
    assert rec["ceilings"] is None  # no ceiling claimed on CPU
    by = {r["name"]: r for r in rec["results"]}
    ours, peer, absent = by["recurscan"], by["same_op"], by["absent"]
    assert ours["role"] == "ours" and ours["status"] == "ok"
    for r in (ours, peer):
        t = r["time_s"]
        assert set(t) >= {"median", "p20", "p80"} and len(t["samples"]) == 2
        assert r["tokens_per_s"] == pytest.approx(200 / t["median"])
        assert r["flops_per_s"] == pytest.approx(rec["workload"]["flops"] / t["median"])
        assert r["bytes_per_s"] == pytest.approx(rec["workload"]["hbm_bytes"] / t["median"])
        assert "pct_peak_flops" not in r
    assert peer["ratio_peer_over_ours"] == pytest.approx(peer["time_s"]["median"] / ours["time_s"]["median"])
    assert peer["agreement_vs"] == "recurscan" and peer["agreement"]["output"]["max_abs_diff"] == 0.0
    assert absent["status"] == "not installed" and "time_s" not in absent and "ratio_peer_over_ours" not in absent


def test_cli_saves_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert runner.main(["--workload", "cpu_gdn_smoke", "--impl", "recurscan", "--warmup", "0", "--repeats", "1",
                        "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["workload"]["name"] for r in data["records"]] == ["cpu_gdn_smoke"]
    assert "recurscan" in capsys.readouterr().out


def test_quantile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert runner.quantile(xs, 0.5) == 3.0
    assert runner.quantile(xs, 0.2) == pytest.approx(1.8)
    assert runner.quantile(xs, 0.8) == pytest.approx(4.2)


def test_save_rows_keeps_rows_and_environment(tmp_path):
    path = tmp_path / "sub" / "rows.json"
    runner.save_rows([{"workload": "w", "median_ms": 1.5}], path, torch.device("cpu"))
    saved = json.loads(path.read_text())
    assert saved["rows"] == [{"workload": "w", "median_ms": 1.5}]
    assert saved["environment"]["device_type"] == "cpu"



def test_delta_variants_stage_alone_of_a_chained_or_phased_shape_is_unchained_and_one_pass():
    """A stage alone of a planned shape that is chained (with a lead: two prep launches) or phased runs
    as the single pass's stage (phases 1, not chained): the chained sweep alone would wait on ready
    flags no prep raises. only_stage refuses chained or phased launches by name."""
    import dataclasses

    from benchmarks.delta_variants import only_stage, variant_launches
    from recurscan.launch.delta import TEST_SHAPE, build_delta_launches
    from tests.helpers.inputs import gdn_inputs

    q, k, v, g, beta, _ = gdn_inputs(1, 300, 2, 4, 16, 24)
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    chained = dataclasses.replace(TEST_SHAPE, block_v=16, phases=3, chained=True, chained_lead=0.4)
    for stage in ("prep", "sweep"):
        alone = variant_launches(q, k, v, g, beta, shape=chained, stage=stage, output_final_state=True)
        kernels = [getattr(s.kernel, "fn", s.kernel).__name__ for s in alone.steps]
        assert alone.chained == -1 and all(s.kwargs.get("PASS") == 0 for s in alone.steps if "PASS" in s.kwargs)
        assert kernels == (["chunk_delta_prep_kernel"] if stage == "prep" else
                           ["chunk_delta_sweep_kernel", "chunk_delta_sweep_kernel"])
        assert all(not s.kwargs.get("READY", False) for s in alone.steps)
    for shape in (chained, dataclasses.replace(chained, chained=False)):
        with pytest.raises(ValueError, match="only_stage: phased or chained"):
            only_stage(build_delta_launches(q, k, v, g, beta, shape, output_final_state=True), "sweep")


@pytest.mark.parametrize("varlen", [False, True])
def test_delta_variants_stages_alone_make_the_whole(varlen):
    """benchmarks/delta_variants.py: the prep alone, then the sweep alone on the prep's buffers,
    give the whole call's bits; the varlen sweep alone ranks the sequences itself first
    (sequence_order_kernel: the prep's ranking is poisoned before it runs). Each stage keeps its
    own kernels' launches, in new Step records: the launches copied from are left as they were."""
    import dataclasses

    from benchmarks.delta_variants import only_stage, sequence_order_kernel, with_constants
    from recurscan.descriptors import build_chunk_descriptors
    from recurscan.launch.delta import (BUFFER_NAMES, CALL_NAMES, TEST_SHAPE, DeltaInputs, build_delta_launches,
                                        run_delta_launches)
    from recurscan.runtime.launcher import jit_launch
    from tests.helpers.inputs import gdp_inputs
    from tests.helpers.tolerances import bits

    q, k, v, g, beta = (x.float() for x in gdp_inputs(200, 1, 1, 2, 16, 16))
    if varlen:
        cu = torch.tensor([0, 1, 70, 71, 200])  # longest last: the ranking reorders the sweep
        d = build_chunk_descriptors(cu, 1)
        kw = dict(cu_seqlens=cu, chunk_indices_dp=d.chunk_indices_dp)
        shape = TEST_SHAPE
    else:
        kw = {}
        shape = dataclasses.replace(TEST_SHAPE, block_v=16, segments=3)  # pass 1, fix-up, pass 2
    inputs = DeltaInputs(q, k, v, g, beta, **kw)
    launches = build_delta_launches(q, k, v, g, beta, shape, output_final_state=True, **kw)
    before = [dataclasses.replace(s, kwargs=dict(s.kwargs)) for s in launches.steps]
    whole = run_delta_launches(build_delta_launches(q, k, v, g, beta, shape, output_final_state=True, **kw), inputs)
    prep, sweep = only_stage(launches, "prep"), only_stage(launches, "sweep")

    def names(p):
        return [getattr(s.kernel, "fn", s.kernel).__name__ for s in p.steps]
    assert names(prep) == ["chunk_delta_prep_kernel"]
    assert names(sweep) == ["sequence_order_kernel"] * varlen + names(launches)[1:]
    assert (sweep.steps[0].kernel is sequence_order_kernel) == varlen
    assert not any(a is b for a in prep.steps + sweep.steps for b in launches.steps)

    made = {n: torch.full(shp, float("nan") if dtype.is_floating_point else -1, dtype=dtype) if fill is None
            else torch.full(shp, fill, dtype=dtype) for n, (shp, dtype, fill) in launches.buffers.items()}
    values = tuple(inputs) + tuple(made.get(n) for n in BUFFER_NAMES)
    for stage in (prep, sweep):
        if stage is sweep and varlen:
            made["sequence_order"].fill_(-1)  # the sweep alone must not read the prep's ranking
        for s in stage.steps:
            jit_launch(s.kernel, s.grid, s.kwargs, s.options, CALL_NAMES, values, s.programmatic, s.min_shared)
    got = [None if i is None else values[i] for i in launches.outputs]
    assert len(got) == len(whole) == 2 and got[1] is not None
    for a, b in zip(got, whole):
        assert torch.equal(bits(a), bits(b))
    run_delta_launches(sweep, inputs)  # runs as launches of its own too (on fresh scratch)
    assert launches.steps == before

    fp16 = with_constants(launches, "prep", INV_FP16=True)
    assert [s.kwargs["INV_FP16"] for s in fp16.steps if s.kernel is launches.steps[0].kernel] == [True]
    assert launches.steps[0].kwargs["INV_FP16"] is False  # float32 inputs: the launches' own choice, kept
    assert [s.kwargs for s in fp16.steps[1:]] == [s.kwargs for s in launches.steps[1:]]
    with pytest.raises(ValueError, match="NO_SUCH"):
        with_constants(launches, "prep", NO_SUCH=1)


def test_the_training_forms_name_settings_the_planner_has(monkeypatch):
    """benchmarks/gpu_gla_sweep.py's training forms (``--train`` with every variant flag): each
    form's settings are attributes of plan.gla (a misspelt one would set a new attribute and time
    the planned form under another name), and each planner flag is flipped alone."""
    from benchmarks import gpu_gla_sweep as bench
    from recurscan.plan import gla as plan_gla
    for flag in ("RECOMPUTE_TWIN", "REVERSE_TWIN", "REVERSE_SPECIALIZED", "DG_SPECIALIZED", "DG_TWIN",
                 "FORWARD_STATES", "FOLD_SSD_GRADS", "V_FROM_X"):
        monkeypatch.setattr(bench, flag, True)
    for name, values in (("GRADS_WAVES", [2]), ("GRADS_DG", ["none"]), ("GRADS_SIDES", [4]),
                         ("REVERSE_SWEEPS", ["32:4"]), ("CORUN", [1.0])):
        monkeypatch.setattr(bench, name, values)
    forms, common = bench.training_forms()
    assert all(hasattr(plan_gla, attr) for settings in forms.values() for attr in settings), forms
    assert set(common) <= set(forms) and len(common) == 2
    flips = {"GLA_FORWARD_STATES": "the chunk states", "GLA_REVERSE_SSD_GRADS": "x and dt",
             "GLA_PARALLEL_V_FROM_X": "v formed", "GLUON_GLA_DG_SPECIALIZED": "the dg twin"}
    for attr, words in flips.items():  # each flag flipped alone, in a form named for what it then runs
        (form,) = [f for f, settings in forms.items() if set(settings) == {attr}]
        assert words in form, form


def test_the_sweep_variants_parse_into_the_shapes_they_name():
    """benchmarks/gpu_gla_sweep.py's ``--sweep`` strings: each token sets the DeltaShape field it
    names (a misread token would time the planned form under another name)."""
    from benchmarks.gpu_gla_sweep import parse_sweep
    shape = parse_sweep("64:4:3:tma:grp:gluon:ws:gh32:pw8:reg0:h4:ph2:pr1.5")
    assert (shape.block_v, shape.num_warps, shape.num_stages) == (64, 4, 3)
    assert shape.tma_store and shape.group_prep and shape.gluon_sweep and shape.specialized
    assert (shape.group_prep_heads, shape.prep_warps, shape.prep_maxnreg, shape.prep_heads) == (32, 8, None, 4)
    assert (shape.phases, shape.phase_ratio) == (2, 1.5)
    shape = parse_sweep("64:4:3:qk:reg128:seg3")
    assert shape.sweep_scores and shape.group_prep and shape.prep_maxnreg == 128 and shape.segments == 3
    assert shape.group_prep_heads == 16 and shape.prep_warps == 4 and not shape.gluon_sweep


def test_plan_assignments_set_a_planner_constant_and_refuse_an_unknown_name(monkeypatch):
    """``--plan NAME=VALUE`` (ab_prev, gpu_delta_train): a literal into recurscan.plan.delta before the
    first call (``NAME.FIELD=VALUE`` into a row's field); a name the planner does not have stops the
    benchmark rather than timing the default."""
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "PREP_SPLIT_INVERSE", plan_delta.PREP_SPLIT_INVERSE)
    runner.set_plan(["PREP_SPLIT_INVERSE=0"])
    assert plan_delta.PREP_SPLIT_INVERSE == 0
    with pytest.raises(SystemExit, match="no 'PREP_SPLIT_INVERS'"):
        runner.set_plan(["PREP_SPLIT_INVERS=16"])
    # NAME.FIELD=VALUE: a field of a planner row (a Gluon twin's switch), its other fields kept
    monkeypatch.setattr(plan_delta, "GLUON_FORWARD_SPECIALIZED", plan_delta.GLUON_FORWARD_SPECIALIZED)
    reason = plan_delta.GLUON_FORWARD_SPECIALIZED.reason
    runner.set_plan(["GLUON_FORWARD_SPECIALIZED.on=True"])
    assert plan_delta.GLUON_FORWARD_SPECIALIZED.on and plan_delta.GLUON_FORWARD_SPECIALIZED.reason == reason


def test_gpu_clocks_summary_drops_the_ramps_and_keeps_every_reason():
    """benchmarks/gpu_clocks.py: the samples' first and last fifth are dropped (ramp up, drain), the
    medians and extremes are of the rest, unreadable fields ([N/A]) are skipped, and every distinct
    clock-event reason seen in the rest is kept."""
    from benchmarks.gpu_clocks import summary
    ramp = [["1980", "2619", "100.0", "40", "0x0"]] * 2
    body = [["1755", "2619", "690.5", "61", "0x4"], ["1785", "2619", "[N/A]", "62", "0x0"],
            ["1770", "2619", "699.0", "63", "0x4"]] * 2
    s = summary(ramp + body + ramp)
    assert s["samples"] == 6 and s["sm_clock_mhz_median"] == 1770 and s["sm_clock_mhz_min"] == 1755
    assert s["power_w_median"] == 694.75 and s["power_w_max"] == 699 and s["temperature_c_max"] == 63
    assert s["clock_event_reasons"] == ["0x0", "0x4"]


def test_probe_processes_run_the_script_once_a_probe_with_its_variable_set(tmp_path):
    """benchmarks/probe_processes.py: each probe in a process of its own (a kernel module reads its
    probe when imported), the variable set to it, the child's extra arguments passed, the rows
    joined in the probes' order."""
    from benchmarks import probe_processes
    script = tmp_path / "child.py"
    script.write_text("import json, os, sys\n"
                      "out = sys.argv[sys.argv.index('--child') + 1]\n"
                      "json.dump([{'probe': os.environ['SOME_PROBE'], 'args': sys.argv[3:]}], open(out, 'w'))\n")
    rows = probe_processes.rows_by_probe(str(script), "SOME_PROBE", ("3", "0"), ["--workload", "w"])
    assert rows == [{"probe": "3", "args": ["--workload", "w"]}, {"probe": "0", "args": ["--workload", "w"]}]


def _probe_command(tmp_path, row: str, probes, workloads, imports: str = ""):
    """A probe benchmark's script in ``tmp_path`` on probe_processes.main (variable SOME_PROBE),
    each child's rows ``row`` (a dict expression of ``w``, a workload) over its workloads: a
    function running it with the given arguments and returning the rows kept in ``--out``."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "probe.py"
    script.write_text("import os, sys\n"
                      f"sys.path.insert(0, {root!r})\n"
                      f"from benchmarks import probe_processes\n{imports}"
                      f"rows = lambda ws: [{row} for w in ws]\n"
                      f"probe_processes.main(__file__, 'doc', 'SOME_PROBE', {tuple(probes)!r}, {tuple(workloads)!r}, "
                      "rows)\n")
    out = tmp_path / "rows.json"

    def run(*args):
        subprocess.run([sys.executable, str(script), *args, "--out", str(out)], check=True, timeout=120)
        return json.load(open(out))["rows"]
    return run


def test_a_probe_benchmarks_command_line_runs_the_chosen_probes_and_workloads(tmp_path):
    """probe_processes.main (benchmarks/gpu_fused_probe.py's and gpu_delta_reverse_probe.py's
    command line): --probe picks the probes, in order, --workload the workloads each child measures,
    --out keeps every child's rows."""
    run = _probe_command(tmp_path, "{'probe': os.environ['SOME_PROBE'], 'workload': w}", ("0", "1", "2"), ("a", "b"))
    assert run("--probe", "2", "--probe", "0", "--workload", "b") == [{"probe": "2", "workload": "b"},
                                                                     {"probe": "0", "workload": "b"}]
    assert run("--probe", "1") == [{"probe": "1", "workload": "a"}, {"probe": "1", "workload": "b"}]


def test_a_probe_benchmark_sets_the_plan_in_each_probes_process(tmp_path):
    """probe_processes.main's --plan: each probe's process sets the planner value before its rows
    (a form behind a switch timed under every probe: FUSED_PIPELINED)."""
    run = _probe_command(tmp_path, "{'probe': os.environ['SOME_PROBE'], 'on': delta.FUSED_PIPELINED}", ("0", "1"),
                         ("a",), imports="from recurscan.plan import delta\n")
    assert run("--plan", "FUSED_PIPELINED=True") == [{"probe": "0", "on": True}, {"probe": "1", "on": True}]
    assert run("--probe", "0") == [{"probe": "0", "on": False}]
