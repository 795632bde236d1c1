"""``recurscan plan`` (recurscan/cli_plan.py) and the cost model behind it (recurscan/plan/cost.py):
what it prints on a machine without a GPU, its usage errors, and the model's parts against
seed 001's step_time and the bytes they name."""
import pytest

from recurscan.algebra import chunk_cost
from recurscan.cli import main
from recurscan.plan.cost import CEILINGS, ceilings_for, predict_chunked, predict_streaming


def test_plan_prints_both_schedules_their_predictions_and_the_choice(capsys):
    assert main(["plan", "--family", "gdn", "--tokens", "16384", "--sequences", "2", "--heads", "4", "--value-heads", "8",
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
    (["--family", "mamba2"], "invalid choice"),
])
def test_plan_usage_errors_are_one_line_and_status_2(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main(["plan", "--device", "cpu", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_cost_model_is_chunk_cost_against_the_bytes_and_the_chains():
    """Chunked: compute = chunk_cost's FLOPs of every pair, chunks counted whole, at the chunked
    kernels' measured rate; chain = one sequence's chunks at the measured chunk step; memory = q,
    k, v, o, gates and the final states at the measured copy rate; the time is the fixed part
    plus the largest. Streaming: its state operations, one token step each. One token favours
    streaming, a long prompt the chunks, many short ones by their work."""
    h200 = CEILINGS["H200"]
    assert ceilings_for("NVIDIA H200") is h200 and ceilings_for("cpu") is None
    p = predict_chunked(16384, 1, 16, 32, 128, 128, h200)
    assert p.compute_s == pytest.approx(chunk_cost(16384, 64, 128, 128).flops * 32 / h200.chunked_flops)
    assert p.chain_s == pytest.approx(256 * h200.chunk_step_s)
    bytes_ = 16384 * (16 * 128 * 2 * 2 + 32 * 128 * 2 * 2 + 32 * (4 + 2)) + 32 * 128 * 128 * 4
    assert p.memory_s == pytest.approx(bytes_ / h200.bytes_per_s)
    assert p.seconds == h200.chunked_fixed_s + max(p.compute_s, p.chain_s, p.memory_s) and p.bound == "chain"
    short = predict_chunked(1, 1, 16, 32, 128, 128, h200)  # one token still costs a whole chunk's products
    assert short.compute_s == pytest.approx(chunk_cost(64, 64, 128, 128).flops * 32 / h200.chunked_flops)
    s = predict_streaming(16384, 1, 16, 32, 128, 128, h200)
    assert s.chain_s == pytest.approx(16384 * h200.token_step_s) and s.seconds > p.seconds
    assert s.compute_s == pytest.approx(16384 * 32 * 128 * 128 * 4 / h200.streaming_ops)
    one = (short, predict_streaming(1, 1, 16, 32, 128, 128, h200))
    assert one[1].seconds < one[0].seconds
    many_short = (predict_chunked(1024 * 4, 1024, 16, 32, 128, 128, h200),
                  predict_streaming(1024 * 4, 1024, 16, 32, 128, 128, h200))
    assert many_short[1].seconds < many_short[0].seconds and many_short[1].bound == "compute"
    many_longer = (predict_chunked(1024 * 16, 1024, 16, 32, 128, 128, h200),
                   predict_streaming(1024 * 16, 1024, 16, 32, 128, 128, h200))
    assert many_longer[0].seconds < many_longer[1].seconds
