"""``recurscan plan`` (recurscan/cli_plan.py) and the cost model behind it (recurscan/plan/cost.py):
what it prints on a machine without a GPU, its usage errors, and the model's parts against
seed 001's step_time and the bytes they name."""
import pytest

from recurscan.algebra import chunk_cost
from recurscan.cli import main
from recurscan.plan.cost import CEILINGS, ceilings_for, predict_chunked, predict_streaming


def test_plan_prints_both_schedules_their_predictions_and_the_choice(capsys):
    assert main(["plan", "--tokens", "16384", "--sequences", "2", "--heads", "4", "--value-heads", "8",
                 "--head-dim", "64", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "16384 tokens in 2 sequence(s), H 4, HV 8, K = V = 64, on cpu" in out
    assert "chunked: chunked on torch" in out and "streaming: recurrent on torch" in out
    assert out.count("  predicted ") == 2 and "; measured " not in out  # no GPU: nothing measured
    assert "the cost model's choice: chunked" in out


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "expected an integer >= 1"),
    (["--heads", "3", "--value-heads", "8"], "not a multiple of --heads"),
    (["--tokens", "2", "--sequences", "4"], "fewer than --sequences"),
    (["--ceilings", "A100"], "invalid choice"),
])
def test_plan_usage_errors_are_one_line_and_status_2(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main(["plan", "--device", "cpu", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_cost_model_is_step_time_against_the_bytes():
    """Chunked: compute = step_time's FLOP time over the pairs (matrix products at the measured
    matmul rate), chain = one program's chunks at the measured chunk step, memory = q, k, v, o,
    gates and the final states at the measured copy rate; the larger of compute + chain and memory.
    Streaming: one token step each. One token favours streaming, a long prompt the chunks."""
    h200 = CEILINGS["H200"]
    assert ceilings_for("NVIDIA H200") is h200 and ceilings_for("cpu") is None
    p = predict_chunked(16384, 1, 16, 32, 128, 128, h200)
    flops = chunk_cost(16384, 64, 128, 128).flops * 32
    assert p.compute_s == pytest.approx(flops / h200.matmul_flops, rel=0.1)  # scalar work hides under it
    assert p.chain_s == pytest.approx(256 * h200.chunk_step_s)
    bytes_ = 16384 * (16 * 128 * 2 * 2 + 32 * 128 * 2 * 2 + 32 * (4 + 2)) + 32 * 128 * 128 * 4
    assert p.memory_s == pytest.approx(bytes_ / h200.bytes_per_s)
    assert p.seconds == max(p.compute_s + p.chain_s, p.memory_s) and p.bound == "chain"
    s = predict_streaming(16384, 1, 16, 32, 128, 128, h200)
    assert s.chain_s == pytest.approx(16384 * h200.token_step_s) and s.seconds > p.seconds
    one = (predict_chunked(1, 1, 16, 32, 128, 128, h200), predict_streaming(1, 1, 16, 32, 128, 128, h200))
    assert one[1].seconds < one[0].seconds
