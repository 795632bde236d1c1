"""The varlen descriptors (recurscan/descriptors.py): the padded chunk index formed with array
operations equals the readable list of (sequence, chunk) pairs, and a call that would derive them
while a CUDA graph is being captured is refused by name before anything runs."""
import random

import pytest
import torch

import recurscan
from recurscan.descriptors import _indices, chunk_pairs


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_the_chunk_index_equals_the_list_of_pairs(chunk_size):
    """Random lengths with the hostile ones (0, 1, 63, 64, 65), none or up to 12 sequences, padding
    rows beyond: the same rows as :func:`chunk_pairs`, padded with (-1, -1)."""
    rng = random.Random(chunk_size)
    for _ in range(200):
        lengths = [rng.choice([0, 1, 63, 64, 65, rng.randint(0, 500)]) for _ in range(rng.randint(0, 12))]
        want = [list(p) for p in chunk_pairs(lengths, chunk_size)]
        rows = len(want) + rng.randint(0, 5)
        got = _indices(lengths, chunk_size, rows)
        assert got.dtype == torch.int32 and got.tolist() == want + [[-1, -1]] * (rows - len(want)), lengths
    with pytest.raises(ValueError, match="max_tokens"):
        _indices([65], chunk_size, -(-65 // chunk_size) - 1)


@pytest.mark.parametrize("op", ["gdn", "gdp", "gla"])
def test_deriving_descriptors_under_capture_is_refused_by_name(monkeypatch, op):
    """A varlen call without chunk_indices / chunk_offsets on the Triton path while a CUDA graph is
    being captured (simulated: the check is torch's is_current_stream_capturing): a ValueError that
    names build_chunk_descriptors, not torch's copy error from inside the capture."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    T, cu = 70, torch.tensor([0, 30, 70])
    q, k, v = torch.randn(1, T, 1, 16), torch.randn(1, T, 1, 16), torch.randn(1, T, 1, 16)
    g, beta = -torch.rand(1, T, 1), torch.rand(1, T, 1)
    with torch.no_grad(), pytest.raises(ValueError, match="build_chunk_descriptors"):
        if op == "gdn":
            recurscan.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, backend="triton")
        elif op == "gdp":
            recurscan.chunk_gated_delta_product_varlen(q, torch.cat([k, k], 1), torch.cat([v, v], 1), g,
                                                       torch.cat([beta, beta], 1), 2, cu, backend="triton")
        else:
            recurscan.chunk_gla(q, k, v, -torch.rand(1, T, 1, 16), cu_seqlens=cu, return_chunk_states=True,
                                backend="triton")
