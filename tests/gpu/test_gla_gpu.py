"""The GLA engine on the GPU (issue 20): the scalar-decay forward kernel at real sizes, bf16."""
import pytest
import torch

import recurscan
from tests.helpers.tolerances import relative_rms

pytestmark = pytest.mark.gpu


def test_simple_gla_triton_forward_at_real_sizes():
    """The GLA engine's first kernel (issue 20) at fla's shape and SSD's core shape, bf16, against
    the float64 chunked oracle on the GPU."""
    from recurscan.reference.gla import gla_chunked
    gen = torch.Generator(device="cuda").manual_seed(7)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    for B, T, H, HV, K, V in ((2, 2048, 4, 4, 128, 128), (1, 4096, 1, 8, 128, 64)):
        q, k, v = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16()
        g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 4)
        h0 = rn(B, HV, K, V) * 0.1
        o, S = recurscan.chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True, backend="triton")
        wo, wS = gla_chunked(q.double(), k.double(), v.double(), g.double(), initial_state=h0.double())
        assert relative_rms(o.double(), wo) < 1e-2 and relative_rms(S.double(), wS) < 1e-2


def test_simple_gla_triton_gradients_at_real_sizes():
    """The GLA backward (kernels/gla/backward.py) at fla's head sizes, bf16, GVA: every gradient
    against autograd through the float64 chunked oracle on the GPU."""
    from recurscan.reference.gla import gla_chunked
    gen = torch.Generator(device="cuda").manual_seed(8)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    B, T, H, HV, K, V = 1, 2048, 2, 4, 128, 128
    x = [rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16(), rn(B, T, HV, V).bfloat16(),
         torch.nn.functional.logsigmoid(rn(B, T, HV) + 4), rn(B, HV, K, V) * 0.1]
    mine = [t.clone().requires_grad_() for t in x]
    o, S = recurscan.chunk_simple_gla(*mine[:4], initial_state=mine[4], output_final_state=True, backend="triton")
    do, dht = rn(*o.shape).bfloat16(), rn(*S.shape)
    got = torch.autograd.grad((o, S), mine, (do, dht))
    ref = [t.double().requires_grad_() for t in x]
    wo, wS = gla_chunked(*ref[:4], initial_state=ref[4])
    want = torch.autograd.grad((wo, wS), ref, (do.double(), dht.double()))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), got, want):
        assert torch.isfinite(a).all(), name
        assert relative_rms(a.double(), b) < 1e-2, f"{name}: {relative_rms(a.double(), b):.2e}"
