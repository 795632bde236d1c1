"""The fused prefill prototype's chunk vectors (benchmarks/gluon_fused_proto.py, issue 21): the
Triton pass that lays out each chunk's cumulative decays, beta and norm factors for the load warp
equals its torch reference, under GVA (several value heads a q/k head) and without the norms."""
import pytest
import torch

from benchmarks.gluon_fused_proto import BT, chunk_vectors, chunk_vectors_reference


@pytest.mark.parametrize("gates", [1, 3], ids=["decays and beta", "with the norm factors"])
@pytest.mark.parametrize("heads", [(1, 1), (2, 4)], ids=["H = HV", "GVA"])
def test_chunk_vectors_match_their_reference(gates, heads):
    H, HV = heads
    gen = torch.Generator().manual_seed(3)
    N, T, K = 2, 2 * BT, 32
    q, k = (torch.randn(N, T, H, K, generator=gen).bfloat16() for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(N, T, HV, generator=gen) + 2.0)
    beta = torch.sigmoid(torch.randn(N, T, HV, generator=gen)).bfloat16()
    want = chunk_vectors_reference(q, k, g, beta, gates)
    got = chunk_vectors(q, k, g, beta, gates)
    assert got.shape == want.shape == (N, HV, T // BT, 4 if gates == 3 else 2, BT)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_chunk_vectors_refuse_strided_inputs_by_name():
    """The pass indexes its inputs as dense tensors: a strided one is refused, named, not misread."""
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(1, BT, 1, 32, generator=gen).bfloat16() for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(1, BT, 2, generator=gen))[..., :1]  # a strided [1, T, 1]
    beta = torch.sigmoid(torch.randn(1, BT, 1, generator=gen)).bfloat16()
    with pytest.raises(ValueError, match="^g: the prototype takes contiguous tensors"):
        chunk_vectors(q, k, g, beta, 3)
