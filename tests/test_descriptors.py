"""The varlen descriptors (recurscan/descriptors.py): the padded chunk index formed with array
operations equals the readable list of (sequence, chunk) pairs, so do the descriptors formed by
tensor operations where cu_seqlens lives (what a GPU call without them derives, with no host
read), and a call that would read cu_seqlens on the host while a CUDA graph is being captured is
refused by name before anything runs."""
import random

import pytest
import torch

import recurscan
from recurscan.descriptors import _indices, build_chunk_descriptors, chunk_pairs, reference_device_descriptors


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


@pytest.mark.parametrize("form", ["pytorch", "triton"])
@pytest.mark.parametrize("M", [1, 2, 3])
def test_descriptors_formed_on_the_device_equal_the_host_built_ones(M, form):
    """Random batches with the hostile lengths (0, 1, 63, 64, 65), 1 to 70 sequences (the kernel
    takes 32 a step), T at or past the tokens (the kernel takes 256 rows a program): the descriptors
    formed without a host read (:func:`reference_device_descriptors`, PyTorch; the Triton kernel
    that ``launch.descriptors.device_descriptors`` launches on CUDA, here under the interpreter) are the tensors of
    ``build_chunk_descriptors(cu, M, max_tokens=T)``, dtype, shape and every entry."""
    from recurscan.launch.descriptors import form_descriptors
    rng = random.Random(M)
    for _ in range(200 if form == "pytorch" else 40):
        lengths = [rng.choice([0, 1, 63, 64, 65, rng.randint(0, 500)])
                   for _ in range(rng.choice([1, 2, rng.randint(1, 12), 32, 33, 70]))]
        cu = [0]
        for L in lengths:
            cu.append(cu[-1] + L)
        T = cu[-1] + rng.choice([0, 0, 1, 64, 200, 20000])
        want = build_chunk_descriptors(cu, M, max_tokens=T)
        cu_t = torch.tensor(cu, dtype=rng.choice([torch.int32, torch.int64]))
        got = reference_device_descriptors(cu_t, M, tokens=T) if form == "pytorch" else form_descriptors(cu_t, M, T)
        for name, a, b in zip(want._fields, want, got):
            assert a.dtype == b.dtype and torch.equal(a, b), (name, cu)


@pytest.mark.parametrize("op", ["gdn", "gdp", "gla"])
def test_deriving_descriptors_on_the_host_under_capture_is_refused_by_name(monkeypatch, op):
    """A varlen call without chunk_indices / chunk_offsets that reads cu_seqlens on the host (chunk
    states, which are trimmed to the batch's chunks; GLA) while a CUDA graph is being captured
    (simulated: the check is torch's is_current_stream_capturing): a ValueError that names
    build_chunk_descriptors, not torch's copy error from inside the capture. A GPU call without
    chunk states forms them on the device, and a capture takes it (tests/gpu)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    T, cu = 70, torch.tensor([0, 30, 70])
    q, k, v = torch.randn(1, T, 1, 16), torch.randn(1, T, 1, 16), torch.randn(1, T, 1, 16)
    g, beta = -torch.rand(1, T, 1), torch.rand(1, T, 1)
    with torch.no_grad(), pytest.raises(ValueError, match="build_chunk_descriptors"):
        if op == "gdn":
            recurscan.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, return_chunk_states=True,
                                             backend="triton")
        elif op == "gdp":
            recurscan.chunk_gated_delta_product_varlen(q, torch.cat([k, k], 1), torch.cat([v, v], 1), g,
                                                       torch.cat([beta, beta], 1), 2, cu, return_chunk_states=True,
                                                       backend="triton")
        else:
            recurscan.chunk_gla(q, k, v, -torch.rand(1, T, 1, 16), cu_seqlens=cu, return_chunk_states=True,
                                backend="triton")


@pytest.mark.parametrize("M", [1, 2], ids=["gdn", "gdp"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_call_without_descriptors_is_the_call_with_them(M, grad):
    """A varlen call that derives its descriptors (one read of cu_seqlens, padded to q's T, the
    launches then those of a call given them): the outputs, final states and gradients of the call
    given build_chunk_descriptors(cu, M), bit for bit, with a one-token and an empty sequence; its
    chunk states trimmed to the batch's own chunks (the padded call's rows past them are padding)."""
    from tests.helpers.inputs import gdn_inputs, gdp_inputs
    cu = torch.tensor([0, 1, 1, 70, 130])
    T = int(cu[-1])
    x = [t.float() for t in (gdn_inputs(1, T, 1, 2, 16, 16, seed=4)[:5] if M == 1
                             else gdp_inputs(T, M, 1, 2, 16, 16, seed=4)[:5])]
    op = recurscan.chunk_gated_delta_rule if M == 1 else \
        (lambda *a, **kw: recurscan.chunk_gated_delta_product_varlen(*a[:5], M, *a[5:], **kw))
    given = recurscan.build_chunk_descriptors(cu, M).as_kwargs()
    if M == 1:
        del given["chunk_indices_dp"]
    outs = {}
    for name, kw in (("derived", {}), ("given", given)):
        leaves = [t.clone().requires_grad_(grad) for t in x]
        with torch.set_grad_enabled(grad):
            o, ht, *cs = op(*leaves, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, output_final_state=True,
                            return_chunk_states=not grad, backend="triton", **kw)
        grads = torch.autograd.grad((o, ht), leaves, (torch.ones_like(o), torch.ones_like(ht))) if grad else ()
        outs[name] = (o, ht, *cs, *grads)
    derived, padded = outs["derived"], outs["given"]
    if not grad:
        chunks = 1 + 0 + 2 + 1  # ceil(L / 64) for L in 1, 0, 69, 60
        assert derived[2].shape[0] == chunks and padded[2].shape[0] >= chunks
        padded = padded[:2] + (padded[2][:chunks],)
    for i, (a, b) in enumerate(zip(derived, padded)):
        assert torch.equal(a, b), i
