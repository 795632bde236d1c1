"""Index tensors (cu_seqlens, state_indices, state_batch_indices, num_accepted_tokens) may arrive as
strided views, as any tensor may: every op then gives what it gives for their contiguous copies,
writes the slots they name and no other (an unnamed slot keeps its bits). The kernels read an index
tensor by element offset, so the ops hand them contiguous ones (``problem.contiguous_indices``).
Triton path under the interpreter, tiny sizes."""
import pytest
import torch

import recurscan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def strided(values, dtype=torch.int64):
    """``values`` as a view with stride 2 (every other element of a tensor twice as long, the
    others a slot or boundary the call must not read)."""
    t = torch.tensor([x for v in values for x in (v, 3)], dtype=dtype, device=DEVICE)
    view = t[::2]
    assert not view.is_contiguous() and view.tolist() == list(values)
    return view


def gen_randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule_update"])
def test_a_strided_state_indices_writes_the_slots_it_names(op):
    q, k, v = (gen_randn(2, 1, 1, 16, seed=s) for s in range(3))
    g, beta = -gen_randn(2, 1, 1, seed=3).abs(), gen_randn(2, 1, 1, seed=4).sigmoid()
    fn = getattr(recurscan, op)
    caches = []
    for slots in (torch.tensor([0, 1], device=DEVICE), strided([0, 1])):
        cache = torch.full((4, 1, 16, 16), float("nan"), device=DEVICE)
        cache[:2] = 0.5
        fn(q, k, v, g, beta, state=cache, state_indices=slots, backend="triton")
        caches.append(cache)
    assert torch.equal(caches[1][:2], caches[0][:2])
    assert caches[1][2:].isnan().all()  # the slot the view skips (3) and the unnamed one keep their bits


def test_a_strided_state_batch_indices_writes_the_slots_it_names():
    H, P, N = 2, 4, 8
    x, dt = gen_randn(2, H, P), gen_randn(2, H, P, seed=1).abs()
    A = -torch.ones(H, device=DEVICE)[:, None, None].expand(H, P, N)
    B, C = gen_randn(2, 1, N, seed=2), gen_randn(2, 1, N, seed=3)
    caches, outs = [], []
    for slots in (torch.tensor([0, 1], device=DEVICE), strided([0, 1])):
        cache = torch.full((4, H, P, N), float("nan"), device=DEVICE)
        cache[:2] = 0.5
        outs.append(recurscan.selective_state_update(cache, x, dt, A, B, C, state_batch_indices=slots,
                                                     backend="triton"))
        caches.append(cache)
    assert torch.equal(outs[1], outs[0]) and torch.equal(caches[1][:2], caches[0][:2])
    assert caches[1][2:].isnan().all()


def test_a_strided_num_accepted_tokens_is_read_as_its_values():
    q, k, v = (gen_randn(2, 3, 1, 16, seed=s) for s in range(3))
    g, beta = -gen_randn(2, 3, 1, seed=3).abs(), gen_randn(2, 3, 1, seed=4).sigmoid()
    outs = []
    for accepted in (torch.tensor([2, 1], device=DEVICE), strided([2, 1])):
        cache = torch.ones(4, 1, 16, 16, device=DEVICE)
        snapshots = torch.arange(12, dtype=torch.float32, device=DEVICE).view(4, 3, 1, 1, 1).expand(4, 3, 1, 16, 16)
        outs.append(recurscan.fused_recurrent_gated_delta_rule_update(
            q, k, v, g, beta, state=cache, state_indices=torch.tensor([0, 2], device=DEVICE),
            intermediate_states=snapshots.clone(), num_accepted_tokens=accepted, backend="triton")[0])
    assert torch.equal(outs[1], outs[0])


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "chunk_simple_gla", "mamba_chunk_scan_combined",
                                "diagonal_scan"])
def test_a_strided_cu_seqlens_is_read_as_its_values(op):
    T, bounds = 70, [0, 3, 70]
    outs = []
    for cu in (torch.tensor(bounds, device=DEVICE), strided(bounds)):
        if op == "chunk_gated_delta_rule":
            q, k, v = (gen_randn(1, T, 1, 16, seed=s) for s in range(3))
            out = recurscan.chunk_gated_delta_rule(q, k, v, -gen_randn(1, T, 1, seed=3).abs(),
                                                   gen_randn(1, T, 1, seed=4).sigmoid(), cu_seqlens=cu,
                                                   output_final_state=True, backend="triton")
        elif op == "chunk_simple_gla":
            q, k, v = (gen_randn(1, T, 1, 16, seed=s) for s in range(3))
            out = recurscan.chunk_simple_gla(q, k, v, -gen_randn(1, T, 1, seed=3).abs(), cu_seqlens=cu,
                                             output_final_state=True, backend="triton")
        elif op == "mamba_chunk_scan_combined":
            x, dt = gen_randn(1, T, 2, 8), gen_randn(1, T, 2, seed=1)
            B, C = gen_randn(1, T, 1, 16, seed=2), gen_randn(1, T, 1, 16, seed=3)
            out = recurscan.mamba_chunk_scan_combined(x, dt, -torch.ones(2, device=DEVICE), B, C, chunk_size=64,
                                                      cu_seqlens=cu, dt_softplus=True, return_varlen_states=True,
                                                      backend="triton")
        else:
            out = recurscan.diagonal_scan(gen_randn(1, T, 4).sigmoid(), gen_randn(1, T, 4, seed=1),
                                          output_final_state=True, cu_seqlens=cu)
        outs.append(out)
    for got, want in zip(outs[1], outs[0]):
        assert torch.equal(got, want)


def test_contiguous_indices_copies_only_a_strided_tensor():
    """The hot path's helper: contiguous tensors come back themselves (no copy), a strided one as a
    contiguous copy of the same values, None and a list of boundaries as they are."""
    from recurscan.problem import contiguous_indices
    dense, view, bounds = torch.tensor([0, 2, 5]), strided([0, 2, 5]), [0, 2, 5]
    out = contiguous_indices(None, dense, bounds)
    assert out[0] is None and out[1] is dense and out[2] is bounds
    out = contiguous_indices(dense, view, None, bounds)
    assert out[0] is dense and out[1].is_contiguous() and out[1].tolist() == [0, 2, 5]
    assert out[2] is None and out[3] is bounds


def test_needs_grad_sees_parameters_and_grad_mode():
    """problem.needs_grad: a tensor subclass (nn.Parameter) that requires grad counts; None and
    non-tensors pass; nothing counts under no_grad."""
    from recurscan.problem import needs_grad
    plain, param = torch.zeros(2), torch.nn.Parameter(torch.zeros(2))
    assert not needs_grad(plain, None, 3.0)
    assert needs_grad(None, plain, param)
    assert needs_grad(plain.requires_grad_(), None)
    with torch.no_grad():
        assert not needs_grad(param, plain)
