"""The warp-specialised Gluon prep (kernels/gluon/delta_prep.py, after its pre-pass) on the GPU,
under the Gluon rules (docs/kernels-gluon.md): its wy, aqk and coefficients within fp16's rounding
of the inverse of its twin's (the Triton prep), and the Triton sweep from them within the float64
oracle's tolerance where the sweep from the twin's is; dense, partial last chunks, runs of chunks
that end inside a sequence, GVA, fp16. Run: ``python -m pytest -m gpu tests/gpu/test_gluon_prep_gpu.py``."""
import pytest
import torch

from recurscan.kernels.delta.prep import chunk_delta_prep_kernel
from recurscan.launch import delta as launch_delta
from recurscan.launch.delta import BUFFER_NAMES, INPUT_NAMES, Step, allocate_buffers, is_sweep_step, launch_steps
from recurscan.launch.delta_prep import gluon_prep_call_ok, gluon_prep_steps
from recurscan.reference.delta import gated_delta_rule_chunked

from tests.helpers.launches import delta_launches
from tests.helpers.tolerances import bits, relative_rms

pytestmark = [pytest.mark.gpu, pytest.mark.unproven]  # not yet run on a GPU

DEV = "cuda"
ROW = dict(block_v=128, num_warps=8, num_stages=3, v_product=True, tma_store=True)


@pytest.fixture(autouse=True)
def poisoned_buffers(gluon_only, monkeypatch):
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)


def both_preps(B, T, H, HV, dtype, scale=0.1):
    """{form: (buffers by name, o, final)} of the Triton prep and the Gluon prep (form "triton",
    "gluon"), each followed by the same Triton sweep; and the inputs."""
    gen = torch.Generator(device=DEV).manual_seed(B * T + HV)
    rn = lambda *s: torch.randn(*s, generator=gen, device=DEV)  # noqa: E731
    q, k, v = (rn(B, T, h, 128).to(dtype) for h in (H, H, HV))
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 3.0)
    beta = torch.sigmoid(rn(B, T, HV)).to(dtype)
    assert gluon_prep_call_ok(q, k, HV)
    launches = delta_launches(q, k, v, g, beta, **ROW, scale=scale, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
    prep = [s for s in launches.steps if s.kernel is chunk_delta_prep_kernel]
    sweep = [s for s in launches.steps if is_sweep_step(s)]
    assert len(prep) == 1 and len(prep) + len(sweep) == len(launches.steps)
    vec, gluon = gluon_prep_steps(Step, B=B, T=T, H=H, HV=HV, K=128, scale=scale, has_g=True, beta_name="beta")
    inputs = (q, k, v, g, beta) + (None,) * (len(INPUT_NAMES) - 5)
    got = {}
    for form, steps in (("triton", prep), ("gluon", gluon)):
        made = allocate_buffers(launches)
        made.update({n: torch.empty(shape, dtype=dt, device=DEV) for n, (shape, dt, _) in vec.items()})
        values = inputs + tuple(made.get(n) for n in BUFFER_NAMES)
        for _ in range(2):  # the JIT launch, then the direct launches: the same bits
            launch_steps(steps + sweep, values)
            got.setdefault(form, []).append((made["o"].clone(), made["final"].clone()))
        assert all(torch.equal(bits(x), bits(y)) for x, y in zip(*got[form]))
        got[form] = made
    return got, (q, k, v, g, beta)


@pytest.mark.parametrize("B, T, H, HV, dtype", [
    (2, 1000, 4, 8, torch.bfloat16),     # partial last chunks; a run of chunks ending inside each sequence
    (1, 64 * 19, 2, 8, torch.float16),   # GVA, fp16, runs of 8 chunks and one of 3
    (3, 65, 1, 1, torch.bfloat16),       # a one-row last chunk
])
def test_gluon_prep_matches_its_twin(B, T, H, HV, dtype):
    got, x = both_preps(B, T, H, HV, dtype)
    a, b = got["triton"], got["gluon"]
    assert relative_rms(b["wy"].float(), a["wy"].float()) < 2e-3
    assert relative_rms(b["aqk"].float(), a["aqk"].float()) < 2e-3
    NT = -(-T // 64)
    for n in range(B):
        for c in range(NT):
            s, rows = (n * T) // 64 + n + c, min(64, T - 64 * c)
            assert relative_rms(b["coef"][s, :, :rows, :3].float(), a["coef"][s, :, :rows, :3].float()) < 1e-5
            assert torch.equal(b["coef"][s, :, 0, 3], a["coef"][s, :, 0, 3])
    o_w, s_w = gated_delta_rule_chunked(*(t.double() for t in x), scale=0.1, use_qk_l2norm_in_kernel=True)
    assert relative_rms(b["o"], o_w) <= 1.25 * relative_rms(a["o"], o_w) + 1e-4
    assert relative_rms(b["final"], s_w) <= 1.25 * relative_rms(a["final"], s_w) + 1e-4
