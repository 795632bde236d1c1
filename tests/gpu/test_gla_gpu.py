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
