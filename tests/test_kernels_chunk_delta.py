"""The chunked delta-rule Triton kernels (recurscan/kernels/delta/, launched by
recurscan/launch/delta.py) under Triton's interpreter, on CPU tensors, against the float64 oracle.

How they run here: tests/conftest.py sets TRITON_INTERPRET=1 on machines without a GPU before
triton is imported, and the public ops take ``backend="triton"``. On a GPU machine these tests
compile the kernels for real on CPU-built inputs moved to the GPU (``DEVICE`` below).

Tolerance (float32 inputs): the oracle's float32 chunked form is held to a relative RMS error of
2e-5 against its float64 token loop (tests/test_reference_delta.py); the kernels compute in
float32 too, so they get the same bound, plus an elementwise bound: every element within
1e-4 x max|reference| (float32 rounding gives ~1e-6; a wrong or unwritten element gives O(1)).
Every buffer the op allocates starts as NaN (recurscan.launch.delta.POISON_BUFFERS).
"""
import pytest
import torch

import recurscan
from recurscan.descriptors import build_chunk_descriptors, padded_chunk_count
from recurscan.kernels.delta.common import RANK_BLOCK
from recurscan.launch import delta as launch_delta
from recurscan.launch.delta import chunk_delta_fwd, phase_bounds, run_delta_launches
from recurscan.plan import RULES, plan
from recurscan.problem import delta_problem
from recurscan.reference.delta import gated_delta_product_naive, gated_delta_rule_naive

from benchmarks.delta_variants import sequence_order_kernel, with_constants
from tests.helpers.inputs import gdn_inputs, gdp_inputs
from tests.helpers.launches import delta_launches
from tests.helpers.tolerances import bits, relative_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32_RMS = 2e-5  # the float32 oracle's own bound (test_reference_delta)
F32_ELEM = 1e-4


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(launch_delta, "POISON_BUFFERS", True)


def f32(*xs):
    return [None if x is None else x.float().to(DEVICE) for x in xs]


def assert_f32_close(got, want, what):
    got = got.detach().double().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = relative_rms(got, want)
    assert err <= F32_RMS, f"{what}: relative RMS error {err:.2e} > {F32_RMS:.0e}"
    worst = (got - want).abs().max().item()
    bound = F32_ELEM * want.abs().max().item() + 1e-12
    assert worst <= bound, f"{what}: max abs error {worst:.2e} > {bound:.2e}"


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_gdn_dense_matches_oracle(T):
    """GVA (H=2, HV=4), K and V not powers of two, an initial state, gates 0 and -inf."""
    q, k, v, g, beta, S0 = gdn_inputs(2, T, 2, 4, 24, 40)
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                  return_chunk_states=True)
    got = recurscan.chunk_gated_delta_rule(*f32(q, k, v, g, beta), initial_state=f32(S0)[0],
                                           output_final_state=True, use_qk_l2norm_in_kernel=True,
                                           return_chunk_states=True, backend="triton")
    assert got[0].dtype == torch.float32 and got[2].shape[0] == 2 * -(-T // 64)
    for a, b, what in zip(got, want, ("o", "final state", "chunk states")):
        assert_f32_close(a, b, what)


@pytest.mark.parametrize("v_product", [True, False])
@pytest.mark.parametrize("P", [1, 3])
def test_both_value_paths_match_oracle(v_product, P):
    """The sweep's two ways of forming U = wy (V - lam o K S) (``v_product``: V^T wy^T as its own
    product, V pipelined through shared memory; or V held in registers) in the single pass and in
    the segment passes: GVA, an initial state, chunk states, gates 0 and -inf, weak decays so that
    states carry across chunks."""
    q, k, v, g, beta, S0 = gdn_inputs(2, 200, 2, 4, 24, 40)
    g = g * 0.02  # -inf and 0 stay
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                  return_chunk_states=True)
    got = chunk_delta_fwd(*f32(q, k, v, g, beta), use_qk_l2norm_in_kernel=True, initial_state=f32(S0)[0],
                          output_final_state=True, return_chunk_states=True, block_v=16,
                          segments=P, v_product=v_product)
    for a, b, what in zip(got, want, ("o", "final state", "chunk states")):
        assert_f32_close(a, b, what)


@pytest.mark.parametrize("T,P", [(1, 1), (65, 1), (200, 1), (200, 3)])
def test_output_by_bulk_tensor_store_matches_oracle(T, P):
    """``tma_store``: the output tiles go out through a descriptor over each sequence's rows, which
    clips the rows past its end (T not a multiple of 64, one-token sequences, the segment passes),
    with V = 40 not a power of two (columns past V clipped too)."""
    q, k, v, g, beta, S0 = gdn_inputs(2, T, 2, 4, 24, 40)
    g = g * 0.02
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True)
    got = chunk_delta_fwd(*f32(q, k, v, g, beta), use_qk_l2norm_in_kernel=True, initial_state=f32(S0)[0],
                          output_final_state=True, block_v=16, segments=P, tma_store=True)
    for a, b, what in zip(got, want, ("o", "final state")):
        assert_f32_close(a, b, what)


@pytest.mark.parametrize("M", [1, 2])
def test_output_by_bulk_tensor_store_varlen_cache_and_padding(M):
    """Varlen with a state cache and a padding slot, the bulk store asked for: M = 1 takes it (a
    sequence's last chunk must not write into the next sequence's rows; the padding sequence's rows
    are zeros), GDP (M = 2: query rows are every M-th expanded row) keeps the masked store."""
    cu = [0, 1, 40, 41, 130]
    q, k, v, g, beta = gdp_inputs(130, M, 2, 4, 16, 24)
    cache = torch.randn(5, 4, 16, 24)
    slots = torch.tensor([3, -1, 0, 1], dtype=torch.int32)
    d = build_chunk_descriptors(cu, M, device=DEVICE)
    o, final, chunks = chunk_delta_fwd(
        *f32(q, k, v, g, beta), num_householder=M, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu),
        chunk_indices_dp=d.chunk_indices_dp, chunk_offsets=d.chunk_offsets, num_chunk_rows=d.chunk_indices.shape[0],
        state=cache.clone().to(DEVICE), state_indices=slots.to(DEVICE), return_chunk_states=True, tma_store=True)
    S0 = torch.zeros(4, 4, 16, 24, dtype=torch.float64)
    S0[[0, 2, 3]] = cache[[3, 0, 1]].double()
    want_o, want_S, _ = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                                  cu_seqlens=torch.tensor(cu), return_chunk_states=True)
    want_o[:, 1:40] = 0
    assert o[:, 1:40].eq(0).all()
    assert_f32_close(o, want_o, "o")
    for n, slot in ((0, 3), (2, 0), (3, 1)):
        assert_f32_close(final[slot], want_S[n], f"slot {slot}")


@pytest.mark.parametrize("M", [1, 2, 3, 4, 8])
def test_gdp_varlen_matches_oracle(M):
    """One-token sequences beside ones crossing chunk boundaries on both streams; for M = 3 the
    expanded chunks end mid-token (ceil(L*M/64) != M*ceil(L/64)); for M = 2 and 4 the query side
    (prep and sweep) is formed on the chunks' query rows alone; M = 8 (8 tokens a chunk, too few
    for a product) keeps the masked form. A reset inside a chunk (token 40) checks the decays of
    the query rows."""
    cu = [0, 1, 2, 66, 67, 130]
    q, k, v, g, beta = gdp_inputs(130, M, 2, 4, 16, 24)
    g[:, 40] = float("-inf")
    S0 = torch.randn(len(cu) - 1, 4, 16, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                     cu_seqlens=torch.tensor(cu), return_chunk_states=True)
    got = recurscan.chunk_gated_delta_product_varlen(
        *f32(q, k, v, g, beta), M, torch.tensor(cu, device=DEVICE), initial_state=f32(S0)[0],
        output_final_state=True, use_qk_l2norm_in_kernel=True, return_chunk_states=True, backend="triton")
    assert got[2].shape[0] == 5  # lengths 1, 1, 64, 1, 64: exact rows when the op builds the descriptors
    for a, b, what in zip(got, want, ("o", "final state", "chunk states")):
        assert_f32_close(a, b, what)


@pytest.mark.parametrize("lengths", [
    [5, 300, 0, 64, 300, 1],  # ties keep index order; an empty sequence goes last
    [1] * 7 + [2],
    list(range(300)),  # ascending, more sequences than one program ranks (BLOCK 128)
    [17],
])
def test_sweep_sequence_order_is_longest_first(lengths):
    """The varlen sweep launches its sequences longest first (ties in index order): exactly a
    stable descending argsort of the lengths, for any N (one program ranks 128 sequences)."""
    cu = torch.tensor([0] + lengths).cumsum(0).to(DEVICE)
    order = torch.full((len(lengths),), -1, dtype=torch.int32, device=DEVICE)
    block = RANK_BLOCK.value
    sequence_order_kernel[(-(-len(lengths) // block),)](cu, order, len(lengths), BLOCK=block)
    want = torch.sort(torch.tensor(lengths), descending=True, stable=True).indices
    assert order.cpu().tolist() == want.tolist()


@pytest.mark.parametrize("lengths", [
    [1, 2, 37, 30, 130],  # shortest first, swept in the opposite order
    [1 + n % 3 for n in range(130)] + [70],  # more sequences than one ranking program takes (128)
])
def test_varlen_sweep_order_matches_oracle(lengths):
    """The sweep walks the sequences longest first (ranked by the prep's first programs): every
    output row, final state and chunk state still lands on its own sequence."""
    cu = torch.tensor([0] + lengths).cumsum(0).tolist()
    q, k, v, g, beta = gdp_inputs(cu[-1], 1, 1, 2, 16, 16)
    S0 = torch.randn(len(lengths), 2, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    want = gated_delta_product_naive(q, k, v, g, beta, 1, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                     cu_seqlens=torch.tensor(cu), return_chunk_states=True)
    got = recurscan.chunk_gated_delta_product_varlen(
        *f32(q, k, v, g, beta), 1, torch.tensor(cu, device=DEVICE), initial_state=f32(S0)[0],
        output_final_state=True, use_qk_l2norm_in_kernel=True, return_chunk_states=True, backend="triton")
    for a, b, what in zip(got, want, ("o", "final state", "chunk states")):
        assert_f32_close(a, b, what)


def test_state_cache_padding_and_untouched_slots():
    """Slots named in state_indices are read and written in place; -1 is padding (zero output, zero
    chunk-state rows, nothing read or written); unnamed slots keep their bits (NaN stays NaN)."""
    M, cu = 2, [0, 1, 40, 41, 130]
    q, k, v, g, beta = gdp_inputs(130, M, 2, 4, 16, 24)
    cache = torch.full((9, 4, 16, 24), float("nan"))
    slots = torch.tensor([7, -1, 0, 3], dtype=torch.int32)
    for s in (7, 0, 3):
        cache[s] = torch.randn(4, 16, 24)
    before = cache.clone()
    cache = cache.to(DEVICE)
    o, final, chunks = recurscan.chunk_gated_delta_product_varlen(
        *f32(q, k, v, g, beta), M, torch.tensor(cu, device=DEVICE), use_qk_l2norm_in_kernel=True, state=cache,
        state_indices=slots.to(DEVICE), return_chunk_states=True, backend="triton")
    assert final is cache
    S0 = torch.zeros(4, 4, 16, 24, dtype=torch.float64)
    S0[[0, 2, 3]] = before[[7, 0, 3]].double()
    want_o, want_S, want_chunks = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0,
                                                             use_qk_l2norm_in_kernel=True,
                                                             cu_seqlens=torch.tensor(cu), return_chunk_states=True)
    want_o[:, 1:40] = 0
    assert o[:, 1:40].eq(0).all()
    assert_f32_close(o, want_o, "o")
    cache = cache.cpu()
    for n, s in ((0, 7), (2, 0), (3, 3)):
        assert_f32_close(cache[s], want_S[n], f"slot {s}")
    untouched = [s for s in range(9) if s not in (7, 0, 3)]
    assert torch.equal(bits(cache[untouched]), bits(before[untouched]))
    assert chunks[1].eq(0).all()
    assert_f32_close(chunks[[0, 2, 3, 4]], want_chunks[[0, 2, 3, 4]], "chunk states")


def test_padded_descriptors_and_empty_sequences():
    """Descriptors built for a larger padded batch (more tokens, zero-length sequences): same
    results, chunk states padded with zero rows past chunk_offsets[N]."""
    M, cu = 2, [0, 5, 5, 70, 70]
    T = cu[-1]
    q, k, v, g, beta = gdp_inputs(T, M, 1, 2, 16, 16)
    S0 = torch.randn(4, 2, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    d = build_chunk_descriptors(cu, M, max_tokens=256, device=DEVICE)
    assert d.chunk_indices.shape[0] == padded_chunk_count(256, 4) == 8
    assert d.chunk_indices_dp.shape[0] == padded_chunk_count(256, 4, M) == 12
    assert d.chunk_offsets.tolist() == [0, 1, 1, 3, 3]
    got = recurscan.chunk_gated_delta_product_varlen(
        *f32(q, k, v, g, beta), M, torch.tensor(cu, device=DEVICE), initial_state=f32(S0)[0],
        output_final_state=True, return_chunk_states=True, backend="triton", **d.as_kwargs())
    want = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0, cu_seqlens=torch.tensor(cu),
                                     return_chunk_states=True)
    assert_f32_close(got[0], want[0], "o")
    assert_f32_close(got[1], want[1], "final state (empty sequences keep their initial state)")
    assert got[2].shape[0] == 8 and got[2][3:].eq(0).all()
    assert_f32_close(got[2][:3], want[2], "chunk states")


@pytest.mark.parametrize("gate", ["zero", "all_reset", "none"])
def test_extreme_gates(gate):
    """log a = 0 everywhere (no decay), -inf everywhere (every token starts from zero), and g=None
    with beta=None (ones)."""
    q, k, v, g, beta, S0 = gdn_inputs(1, 70, 1, 2, 16, 16, resets=False)
    if gate == "zero":
        g = torch.zeros_like(g)
    elif gate == "all_reset":
        g = torch.full_like(g, float("-inf"))
    else:
        g, beta = None, None
    want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0[:1], use_qk_l2norm_in_kernel=True)
    got = recurscan.chunk_gated_delta_rule(*f32(q, k, v, g, beta), initial_state=f32(S0[:1])[0],
                                           output_final_state=True, use_qk_l2norm_in_kernel=True,
                                           backend="triton")
    for a, b, what in zip(got, want, ("o", "final state")):
        assert_f32_close(a, b, what)


def test_no_l2norm_and_custom_scale():
    q, k, v, g, beta, S0 = gdn_inputs(1, 100, 2, 2, 16, 16, resets=False)
    k = torch.nn.functional.normalize(k, dim=-1)  # unit keys keep the un-normalised recurrence bounded
    want = gated_delta_rule_naive(q, k, v, g, beta, scale=0.3)
    got = recurscan.chunk_gated_delta_rule(*f32(q, k, v, g, beta), scale=0.3, output_final_state=True,
                                           backend="triton")
    for a, b, what in zip(got, want, ("o", "final state")):
        assert_f32_close(a, b, what)


def test_bfloat16_inputs():
    """bf16 inputs: the products take bf16 operands (as fla's), so the error is bf16 rounding:
    relative RMS <= 1e-2 (METHOD.md's band for bf16 operands), against float64 on the same
    (bf16-rounded) inputs. Output in bf16, states in float32."""
    q, k, v, g, beta, S0 = gdn_inputs(1, 130, 2, 4, 32, 32)
    q, k, v, beta = (x.bfloat16() for x in (q, k, v, beta))
    want = gated_delta_rule_naive(q.double(), k.double(), v.double(), g, beta.double(), initial_state=S0[:1],
                                  use_qk_l2norm_in_kernel=True)
    dev = lambda x: x.to(DEVICE)  # noqa: E731
    o, S = recurscan.chunk_gated_delta_rule(dev(q), dev(k), dev(v), dev(g.float()), dev(beta),
                                            initial_state=dev(S0[:1].float()), output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, backend="triton")
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert relative_rms(o.cpu(), want[0]) <= 1e-2 and relative_rms(S.cpu(), want[1]) <= 1e-2


@pytest.mark.parametrize("case", ["contraction", "beta_above_2", "negative_beta", "long_raw_keys",
                                  "one_value_head_of_a_group_above_2"])
def test_wy_inverse_on_fp16_operands_only_where_every_step_contracts(case):
    """16-bit inputs run the WY inverse on fp16 operands in a chunk whose steps are all
    contractions (0 <= beta |k|^2 <= 2; Tinv's entries are then at most 1), else on tf32, whose
    range it needs. A chunk outside the bound takes exactly the tf32 path (bit-identical to the
    prep's ``INV_FP16=False``, set by benchmarks/delta_variants.py's ``with_constants``); a
    contracting one takes the fp16 path (it differs in rounding) and stays within the bf16 bound of
    test_bfloat16_inputs against float64. The choice is per value head: one prep program serves the
    value heads of a query/key head (GVA), and a head outside the bound must not pull its group's
    other heads onto tf32, nor the reverse."""
    q, k, v, g, beta, S0 = gdn_inputs(1, 130, 2, 4, 32, 32)
    l2norm = case != "long_raw_keys"
    if case == "beta_above_2":
        beta[:, ::16] = 2.5  # one expanding step in every 16 rows: every chunk is outside the bound
    elif case == "negative_beta":
        beta[:, ::16] = -0.5
    elif case == "long_raw_keys":
        k, q = k * 0.6, q * 0.2  # |k|^2 ~ 11.5 with beta in (0, 1): raw keys, no L2 norm
    elif case == "one_value_head_of_a_group_above_2":
        beta[:, ::16, 1] = 2.5  # value heads 0 and 1 share q/k head 0: only head 1 leaves the bound
    q, k, v, beta = (x.bfloat16().to(DEVICE) for x in (q, k, v, beta))
    args = (q, k, v, g.float().to(DEVICE), beta)
    kw = dict(initial_state=S0[:1].float().to(DEVICE), output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    launches = delta_launches(*args, **kw)
    inputs = launch_delta.DeltaInputs(*args, initial_state=kw["initial_state"])
    fast = run_delta_launches(with_constants(launches, "prep", INV_FP16=True), inputs)
    tf32 = run_delta_launches(with_constants(launches, "prep", INV_FP16=False), inputs)
    if case == "contraction":
        assert not torch.equal(fast[0], tf32[0]), "the fp16 path did not run"
        want = gated_delta_rule_naive(*(x.double().cpu() for x in args), initial_state=S0[:1],
                                      use_qk_l2norm_in_kernel=True)
        assert relative_rms(fast[0].cpu(), want[0]) <= 1e-2 and relative_rms(fast[1].cpu(), want[1]) <= 1e-2
    elif case == "one_value_head_of_a_group_above_2":
        assert k.shape[2] == 2 and v.shape[2] == 4  # groups of two value heads
        for hv in range(4):
            same = torch.equal(bits(fast[0][:, :, hv]), bits(tf32[0][:, :, hv])) and \
                torch.equal(bits(fast[1][:, hv]), bits(tf32[1][:, hv]))
            assert same == (hv == 1), f"value head {hv}: {'tf32' if same else 'fp16'} path"
    else:
        assert torch.equal(bits(fast[0]), bits(tf32[0])) and torch.equal(bits(fast[1]), bits(tf32[1]))


@pytest.mark.parametrize("split", [16, 32])
@pytest.mark.parametrize("M", [1, 2])
def test_the_inverse_split_into_diagonal_blocks_is_the_whole_tile_inverse(split, M):
    """The prep's INV_SPLIT (plan.delta.PREP_SPLIT_INVERSE): the first doubling levels on the
    diagonal blocks as a batch. The same doubling (the products it drops are of zero blocks), so the
    state equals the whole-tile form's to float32 rounding, and both stay within the bf16 bound
    against float64, GDN and GDP, over a partial last chunk (tests/test_inverse_forms.py takes the
    inverse alone against float64's, on correlated keys too)."""
    if M == 1:
        q, k, v, g, beta, S0 = gdn_inputs(1, 130, 2, 4, 32, 32)
    else:
        q, k, v, g, beta = gdp_inputs(130, M, 2, 4, 32, 32)
        S0 = torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    q, k, v, beta = (x.bfloat16().to(DEVICE) for x in (q, k, v, beta))
    args = (q, k, v, g.float().to(DEVICE), beta)
    h0 = S0.float().to(DEVICE)
    launches = delta_launches(*args, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                              num_householder=M)
    inputs = launch_delta.DeltaInputs(*args, initial_state=h0)
    whole = run_delta_launches(with_constants(launches, "prep", INV_SPLIT=0), inputs)
    split_form = run_delta_launches(with_constants(launches, "prep", INV_SPLIT=split), inputs)
    assert relative_rms(split_form[1].cpu(), whole[1].cpu()) <= 1e-5
    want = gated_delta_product_naive(*(x.double().cpu() for x in args), M, initial_state=S0,
                                     use_qk_l2norm_in_kernel=True)
    for got in (split_form, whole):
        assert relative_rms(got[0].cpu(), want[0]) <= 1e-2 and relative_rms(got[1].cpu(), want[1]) <= 1e-2


@pytest.mark.parametrize("query", [1, 0])
def test_the_prep_without_its_query_part_leaves_the_state_as_it_was(query):
    """The prep's QUERY switch, which benchmarks/gpu_prep_query_share.py sets to time what the
    query's part of the prep costs: 1 (q loaded for its norms alone) and 0 (no q) drop only what
    the outputs read (aqk, and with 0 the q norms in lam rq), so the final state, which reads
    neither, is bit for bit the planned prep's (GVA, an initial state, a partial last chunk)."""
    q, k, v, g, beta, S0 = gdn_inputs(1, 130, 2, 4, 32, 32)
    q, k, v, beta = (x.bfloat16().to(DEVICE) for x in (q, k, v, beta))
    args = (q, k, v, g.float().to(DEVICE), beta)
    h0 = S0[:1].float().to(DEVICE)
    launches = delta_launches(*args, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    inputs = launch_delta.DeltaInputs(*args, initial_state=h0)
    planned = run_delta_launches(launches, inputs)
    without = run_delta_launches(with_constants(launches, "prep", QUERY=query), inputs)
    assert torch.equal(bits(without[1]), bits(planned[1]))
    want = gated_delta_rule_naive(*(x.double().cpu() for x in args), initial_state=S0[:1],
                                  use_qk_l2norm_in_kernel=True)
    assert relative_rms(planned[1].cpu(), want[1]) <= 1e-2


@pytest.mark.parametrize("M, cu", [(1, None), (1, [0, 1, 70, 130]), (2, [0, 40, 90])])
def test_gradients_through_the_triton_path(M, cu):
    """Inputs that require grad: the Triton forward, the written-out chunkwise backward
    (autograd/delta.py). Every gradient against autograd through the float64 oracle, bounded by
    what the float32 oracle (the torch backend) gets."""
    from tests.helpers.tolerances import assert_like_fp32
    T = 130 if M == 1 else 90
    if M == 1:
        q, k, v, g, beta, S0 = gdn_inputs(1, T, 2, 4, 16, 16, seed=11)
    else:
        q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 16, 16, seed=12)
    cu_t = None if cu is None else torch.tensor(cu)
    N = 1 if cu is None else len(cu) - 1
    S0 = torch.randn(N, 4, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    gen = torch.Generator().manual_seed(14)
    do = torch.randn(1, T, 4, 16, dtype=torch.float64, generator=gen)
    dht = torch.randn(N, 4, 16, 16, dtype=torch.float64, generator=gen)

    def grads(dtype, backend, device):
        leaves = [x.to(device=device, dtype=dtype).requires_grad_() for x in (q, k, v, g, beta, S0)]
        kw = dict(initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True, backend=backend)
        if M == 1:
            o, S = recurscan.chunk_gated_delta_rule(*leaves[:5], cu_seqlens=None if cu_t is None else cu_t.to(device),
                                                    **kw)
        else:
            o, S = recurscan.chunk_gated_delta_product_varlen(*leaves[:5], M, cu_t.to(device), **kw)
        return torch.autograd.grad((o, S), leaves, (do.to(device, o.dtype), dht.to(device, S.dtype)))

    want64 = grads(torch.float64, "torch", "cpu")
    ref32 = grads(torch.float32, "torch", "cpu")
    got = grads(torch.float32, "triton", DEVICE)
    for name, a, b, r in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want64, ref32):
        assert a.dtype == torch.float32
        assert_like_fp32(a.cpu(), b, r, name)


def test_cache_and_chunk_states_are_inference_only():
    q, k, v, g, beta, _ = gdn_inputs(1, 8, 1, 1, 16, 16)
    q = q.float().to(DEVICE).requires_grad_()
    cache, slots = torch.zeros(2, 1, 16, 16, device=DEVICE), torch.tensor([1], device=DEVICE)
    with pytest.raises(NotImplementedError, match="inference-only"):
        recurscan.chunk_gated_delta_rule(q, *f32(k, v, g, beta), state=cache, state_indices=slots, backend="triton")
    with pytest.raises(NotImplementedError, match="inference-only"):
        recurscan.chunk_gated_delta_rule(q, *f32(k, v, g, beta), return_chunk_states=True, backend="triton")
    assert cache.eq(0).all()
    with torch.no_grad():
        recurscan.chunk_gated_delta_rule(q, *f32(k, v, g, beta), state=cache, state_indices=slots, backend="triton")


def test_backend_argument_is_checked():
    q, k, v, g, beta, _ = gdn_inputs(1, 8, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="backend: expected None, 'torch' or 'triton', got 'cuda'"):
        recurscan.chunk_gated_delta_rule(q, k, v, g, beta, backend="cuda")
    with pytest.raises(ValueError, match="beta per value column"):
        recurscan.chunk_gated_delta_rule(*f32(q, k, v, g), torch.rand(1, 8, 1, 16), backend="triton")


def test_planner_rows():
    """CPU tensors take the oracle unless asked; chunked delta-rule problems on CUDA take Triton;
    decode and unsupported problems do not."""
    q, k, v, g, beta, _ = gdn_inputs(1, 8, 1, 2, 16, 16, dtype=torch.float32)
    p = delta_problem(q, k, v, g, beta)
    assert plan("delta_rule", p, torch.device("cpu")).backend == "torch"
    cuda = torch.device("cuda")
    first = lambda prob, alg="chunked": next(r for r in RULES if r.applies("delta_rule", prob, cuda, alg))  # noqa
    assert first(p).backend == "triton"
    decode = first(p, "recurrent")  # decode takes the streaming kernel, never the chunked ones
    assert decode.backend == "triton" and decode is not first(p) and "streaming" in decode.reason
    per_value = delta_problem(q, k, v, g, torch.rand(1, 8, 2, 16))
    assert first(per_value).backend == "torch"
    assert first(delta_problem(*(x.double() for x in (q, k, v, g, beta)))).backend == "torch"


@pytest.mark.parametrize("pairs,tokens,varlen,sequences,want", [
    (32, 16384, False, 1, (64, 4, 3, 1, True, True, 6)),    # B1 T16384 HV32: one pass in phases, bulk store
    (32, 65536, False, 1, (64, 4, 3, 1, True, True, 8)),
    (64, 16384, False, 2, (64, 4, 3, 1, True, True, 1)),    # B2 HV32: the sweep takes most SMs, no phases
    (16, 16384, False, 1, (64, 4, 3, 4, True, True, 1)),    # B1 HV16: too few programs, segments
    (16, 8192, False, 4, (64, 4, 3, 4, True, True, 1)),     # B4 T8192 HV4: few pairs, segments
    (64, 8192, False, 4, (64, 4, 3, 1, True, False, 1)),    # B4 T8192 HV16: enough pairs, one pass
    (64, 4096, False, 4, (64, 4, 3, 1, True, False, 1)),    # B4 T4096 H=HV=16: one 64-column program per SM
    (64, 8192, True, 4, (64, 4, 3, 1, True, False, 1)),     # GDP M2 B4 T4096 (varlen, expanded stream)
    (256, 8192, False, 4, (128, 8, 3, 1, True, True, 1)),   # B4 T8192 HV64: more programs than SMs
    (512, 32976, True, 16, (128, 8, 3, 1, True, True, 1)),  # varlen 16 sequences x HV32 (mean 2061 tokens)
    (2048, 32768, True, 64, (128, 8, 3, 1, True, False, 1)),  # 64 sequences of 512: no bulk store
    (20, 4096, False, 1, (32, 4, 2, 1, False, False, 1)),
    (4, 4096, False, 1, (16, 4, 2, 1, False, False, 1)),
    (16, 32768, True, 2, (64, 4, 3, 4, True, True, 1)),     # varlen 2 x 16384 HV8: each sequence in 4 segments
    (16, 32768, True, 4, (64, 4, 3, 4, True, True, 1)),     # varlen 4 x 8192 HV4
    (16, 8192, True, 4, (16, 4, 2, 1, False, False, 1)),    # varlen 4 x 2048: too short to cut
])
def test_launch_rows_on_an_h200(pairs, tokens, varlen, sequences, want):
    """The launch table's choice for the measured workloads on 132 SMs (plan/delta.py cites the figures)."""
    from recurscan.plan import DELTA_LAUNCH, DeltaSizes
    shape = DeltaSizes(pairs=pairs, sms=132, value_dim=128, tokens=tokens, varlen=varlen, sequences=sequences)
    L = next(launch for applies, launch in DELTA_LAUNCH if applies(shape))
    assert (L.block_v, L.num_warps, L.num_stages, L.segments, L.v_product, L.tma_store, L.phases) == want, L.reason
    assert L.prep_maxnreg == 168, L.reason  # three prep programs a multiprocessor


# ----------------------------------------------------------------------------------------------
# Segment-parallel sweep (chunk_delta_fwd(segments=P): DeltaShape.segments, dense batches)
# ----------------------------------------------------------------------------------------------


def _fwd(q, k, v, g, beta, M, P, **kw):
    return chunk_delta_fwd(*f32(q, k, v, g, beta), num_householder=M, use_qk_l2norm_in_kernel=True,
                           segments=P, block_v=16, **kw)


@pytest.mark.parametrize("T,M,Ps", [(400, 1, (2, 3, 4)), (200, 2, (2, 4)), (65, 1, (2,))])
def test_segments_match_oracle_and_single_pass(T, M, Ps):
    """P segments (T=400: 7 token chunks, cut 4+3, 3+3+1, 2+2+2+1; T=200 GDP M=2: 2+2, 1+1+1+1;
    T=65: 1+1) against the float64 oracle and the single pass: GVA, an initial state, chunk states,
    gates 0 and -inf (a reset on a segment's first token and one inside a segment). The decays are
    weak (log decay ~ -0.003 per token) so that states carry across segments: with the inputs'
    usual decays (~0.88 per token) a wrong fix-up would hide under the tolerance."""
    if M == 1:
        q, k, v, g, beta, S0 = gdn_inputs(2, T, 2, 4, 24, 40)
        g = g * 0.02  # -inf and 0 stay
        if T > 192:
            g[:, 192, 1] = float("-inf")  # the first token of token chunk 3 (a segment start for P = 3)
            g[:, 130:140, 2] = 0.0
        else:
            g[:, 64, 1] = float("-inf")  # token chunk 1's first token (the segment start for P = 2)
        want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                      return_chunk_states=True)
    else:
        q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 24, 40)
        g = g * 0.02
        g[:, 128, 0] = float("-inf")  # token chunk 2's first token (a segment start for P = 2, 4)
        S0 = torch.randn(1, 4, 24, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
        want = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                         return_chunk_states=True)
    kw = dict(initial_state=f32(S0)[0], output_final_state=True, return_chunk_states=True)
    single = _fwd(q, k, v, g, beta, M, 1, **kw)
    for P in Ps:
        got = _fwd(q, k, v, g, beta, M, P, **kw)
        for a, b, c, what in zip(got, want, single, ("o", "final state", "chunk states")):
            assert_f32_close(a, b, f"P={P} {what}")
            assert_f32_close(a, c.double().cpu(), f"P={P} {what} vs single pass")


def _check_dense_cache_batch(run):
    """A dense batch of 3 with a state cache, through ``run(q, k, v, g, beta, cache, slots) ->
    (o, final, chunk states)``: slot -1 (zero output and chunk states, nothing read or written),
    NaN in unnamed slots (bit-identical after), the final states back in place; weak decays, so
    that the states carry across segments or phases."""
    T = 200
    q, k, v, g, beta, _ = gdn_inputs(3, T, 1, 2, 16, 24)
    g = g * 0.02
    cache = torch.full((6, 2, 16, 24), float("nan"))
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)
    cache[4], cache[1] = torch.randn(2, 2, 16, 24, generator=torch.Generator().manual_seed(9))
    before = cache.clone()
    cache = cache.to(DEVICE)
    o, final, chunks = run(q, k, v, g, beta, cache, slots.to(DEVICE))
    assert final is cache
    S0 = torch.zeros(3, 2, 16, 24, dtype=torch.float64)
    S0[[0, 2]] = before[[4, 1]].double()
    want_o, want_S, want_c = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                                    return_chunk_states=True)
    o, chunks, cache = o.cpu(), chunks.cpu(), cache.cpu()
    assert o[1].eq(0).all() and chunks[4:8].eq(0).all()
    want_o[1] = 0
    want_c[4:8] = 0
    assert_f32_close(o, want_o, "o")
    assert_f32_close(chunks, want_c, "chunk states")
    assert_f32_close(cache[4], want_S[0], "slot 4")
    assert_f32_close(cache[1], want_S[2], "slot 1")
    untouched = [0, 2, 3, 5]
    assert torch.equal(bits(cache[untouched]), bits(before[untouched]))


def test_segments_state_cache_padding_and_untouched_slots():
    """Segments with a state cache (_check_dense_cache_batch): the final state goes back in place
    by the last segment while segment 0 read the slot (pass 1: no race)."""
    _check_dense_cache_batch(lambda q, k, v, g, beta, cache, slots: _fwd(
        q, k, v, g, beta, 1, 3, state=cache, state_indices=slots, return_chunk_states=True))


@pytest.mark.parametrize("M, P", [(1, 2), (1, 3), (2, 4)])
@pytest.mark.parametrize("cache", [False, True], ids=["initial states", "a state cache with padding"])
def test_segments_cut_each_varlen_sequence_by_its_own_length(M, P, cache):
    """Varlen in P segments: each sequence in P segments of its own chunks (an empty, a one-token
    and a one-chunk sequence, whose segments are empty or one chunk; a long one cut across
    resets), weak decays so that states carry across segments: outputs, final states and chunk
    states against the float64 oracle per sequence and equal, within float32 rounding, to the
    single pass; a state cache with a padding slot keeps its unnamed slots' bits."""
    cu = [0, 0, 1, 65, 400] if M == 1 else [0, 0, 1, 65, 200]
    T, N = cu[-1], len(cu) - 1
    q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 24, 40)
    g = g * 0.02
    g[:, 130, 1] = float("-inf")
    cu_t = torch.tensor(cu, device=DEVICE)
    d = build_chunk_descriptors(cu, M, device=DEVICE)
    gen = torch.Generator().manual_seed(5)
    S0 = torch.randn(N, 4, 24, 40, dtype=torch.float64, generator=gen)
    kw = dict(cu_seqlens=cu_t, chunk_indices_dp=d.chunk_indices_dp, chunk_offsets=d.chunk_offsets,
              num_chunk_rows=d.chunk_indices.shape[0], return_chunk_states=True)
    if cache:
        slots = torch.tensor([3, -1, 0, 5], dtype=torch.int32)
        pool = torch.full((7, 4, 24, 40), float("nan"))
        pool[[3, 0, 5]] = f32(S0[[0, 2, 3]])[0].cpu()
        S0[1] = 0
        runs = {}
        for p in (1, P):
            c = pool.clone().to(DEVICE)
            runs[p] = _fwd(q, k, v, g, beta, M, p, state=c, state_indices=slots.to(DEVICE), **kw)
        untouched = [1, 2, 4, 6]
        assert torch.equal(bits(runs[P][1].cpu()[untouched]), bits(pool[untouched]))
    else:
        runs = {p: _fwd(q, k, v, g, beta, M, p, initial_state=f32(S0)[0], output_final_state=True, **kw)
                for p in (1, P)}
    naive = gated_delta_rule_naive if M == 1 else (lambda *a, **k_: gated_delta_product_naive(*a[:5], M, *a[5:], **k_))
    want = naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu),
                 return_chunk_states=True)
    got, single = runs[P], runs[1]
    o, final, chunks = got[0].cpu(), got[1].cpu(), got[2].cpu()
    rows = want[2].shape[0]
    if cache:  # the padding sequence (1): zero outputs and chunk states; the others' finals in their slots
        assert o[:, cu[1]:cu[2]].eq(0).all() and chunks[d.chunk_offsets[1]:d.chunk_offsets[2]].eq(0).all()
        want[0][:, cu[1]:cu[2]] = 0
        want[2][d.chunk_offsets[1]:d.chunk_offsets[2]] = 0
        final, want_final = final[[3, 0, 5]], want[1][[0, 2, 3]]
    else:
        want_final = want[1]
    assert_f32_close(o, want[0], f"P={P} o")
    assert_f32_close(final, want_final, f"P={P} final states")
    assert_f32_close(chunks[:rows], want[2], f"P={P} chunk states")
    for i, (a, b) in enumerate(zip(got, single)):
        if cache and i == 1:  # the pool: its live slots (NaN elsewhere), in both runs
            a, b = a[[3, 0, 5]], b[[3, 0, 5]]
        assert_f32_close(a.cpu(), b.double().cpu(), f"P={P} against the single pass")


@pytest.mark.parametrize("T,M,phases", [(300, 1, (2, 3, 5)), (200, 2, (2, 4)), (65, 1, (2,)), (64, 1, (2,))])
def test_phases_equal_the_single_pass_bit_for_bit(T, M, phases):
    """The phased sweep (prep and sweep of each phase in turn, the state carried between phases)
    walks the single pass's chunks in its order: the same bits for outputs, final and chunk states,
    and the oracle's values; with a reset at a phase boundary and in a partial last chunk. T = 64:
    one token chunk, so one phase whatever is asked."""
    if M == 1:
        q, k, v, g, beta, S0 = gdn_inputs(2, T, 2, 4, 16, 24)
        S0 = S0[:2]
        g[:, min(87, T - 1), 1] = float("-inf")
        g[:, T - 1, 2] = float("-inf")
        want = gated_delta_rule_naive(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                      return_chunk_states=True)
    else:
        q, k, v, g, beta = gdp_inputs(T, M, 2, 4, 16, 24)
        g[:, 128, 0] = float("-inf")
        S0 = torch.randn(1, 4, 16, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
        want = gated_delta_product_naive(q, k, v, g, beta, M, initial_state=S0, use_qk_l2norm_in_kernel=True,
                                         return_chunk_states=True)
    kw = dict(num_householder=M, initial_state=f32(S0)[0], output_final_state=True, use_qk_l2norm_in_kernel=True,
              return_chunk_states=True, block_v=16)
    single = chunk_delta_fwd(*f32(q, k, v, g, beta), **kw)
    for a, b, what in zip(single, want, ("o", "final state", "chunk states")):
        assert_f32_close(a, b, what)
    for n in phases:
        got = chunk_delta_fwd(*f32(q, k, v, g, beta), phases=n, **kw)
        for a, b, what in zip(got, single, ("o", "final state", "chunk states")):
            assert torch.equal(bits(a), bits(b)), f"phases={n}: {what} differs from the single pass"


def test_phases_state_cache_padding_and_untouched_slots():
    """Phases with a state cache (_check_dense_cache_batch): the first phase reads the slot, the
    last writes it back; slot -1 gets zero outputs and chunk states in every phase."""
    _check_dense_cache_batch(lambda q, k, v, g, beta, cache, slots: chunk_delta_fwd(
        *f32(q, k, v, g, beta), use_qk_l2norm_in_kernel=True, state=cache, state_indices=slots,
        return_chunk_states=True, phases=3))


def test_phases_launch_order():
    """The plan of a phased call: prep and sweep alternate, each phase's prep over its own chunks,
    then the replay launch (a sweep over whole sequences, for programs whose state came out
    non-finite); under the interpreter no launch is a programmatic dependent (the GPU's launches
    are checked in tests/gpu)."""
    q, k, v, g, beta, _ = gdn_inputs(1, 300, 1, 2, 16, 24)
    plan_ = delta_launches(*f32(q, k, v, g, beta), phases=3)
    names = [s.kernel.fn.__name__ if hasattr(s.kernel, "fn") else s.kernel.__name__ for s in plan_.steps]
    assert names == ["chunk_delta_prep_kernel", "chunk_delta_sweep_kernel"] * 3 + ["chunk_delta_sweep_kernel"]
    replay = plan_.steps.pop()
    assert replay.kwargs["REPLAY"] and replay.kwargs["PASS"] == 0 and replay.programmatic
    spans = [(s.kwargs["chunk_lo"], s.kwargs["chunk_span"]) for s in plan_.steps[::2]]
    bounds = phase_bounds(5, 3)
    assert spans == [(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]
    assert [(s.kwargs["tc_first"], s.kwargs["tc_count"]) for s in plan_.steps[1::2]] == spans
    # Each prep reserves 48 KB of shared memory, so that none of its programs fits beside a sweep program.
    assert [s.min_shared for s in plan_.steps[::2]] == [48 * 1024] * 3
    assert [s.min_shared for s in plan_.steps[1::2]] == [0] * 3


@pytest.mark.parametrize("T,chunk_states,lead", [(300, True, 0.0), (65, False, 0.0), (64, True, 0.0), (1, False, 0.0),
                                                  (300, True, 0.3), (65, False, 0.5), (64, False, 0.9)])
def test_chained_schedule_equals_the_single_pass_bit_for_bit(T, chunk_states, lead):
    """The chained schedule (DeltaShape.chained: the sweep waiting on each chunk's ready flag, the
    prep raising them) changes when each chunk's prep runs, not the arithmetic: the single pass's
    bits for outputs, final and chunk states, with an initial state, a reset and a partial last chunk;
    so does a lead (chained_lead: the first chunks prepared before the sweep starts), down to one
    chunk left beside it. Under the interpreter the prep runs first (the GPU's overlap:
    tests/gpu/test_gluon_sweep_gpu.py)."""
    q, k, v, g, beta, S0 = gdn_inputs(2, T, 2, 4, 16, 24)
    g[:, min(87, T - 1), 1] = float("-inf")
    kw = dict(initial_state=f32(S0[:2])[0], output_final_state=True, use_qk_l2norm_in_kernel=True,
              return_chunk_states=chunk_states, block_v=16)
    single = chunk_delta_fwd(*f32(q, k, v, g, beta), **kw)
    chained = chunk_delta_fwd(*f32(q, k, v, g, beta), chained=True, chained_lead=lead, phases=3, **kw)
    for a, b, what in zip(chained, single, ("o", "final state", "chunk states")):
        assert torch.equal(bits(a), bits(b)), f"T={T}, lead {lead}: {what} differs from the single pass"


@pytest.mark.parametrize("lead", [0.0, 0.5])
def test_chained_schedule_keeps_the_prep_for_the_backward_as_unchained(lead):
    """A forward under autograd keeps its prep's outputs (keep_prep: wy, G o Tinv, aqk, coef) for the
    backward: chained, with or without a lead, each is the phased run's, bit for bit (coef's lam_last
    on each chunk's first row, the only one written), and so are the outputs and the final state."""
    q, k, v, g, beta, _ = gdn_inputs(2, 200, 2, 4, 16, 24)
    args = f32(q, k, v, g, beta)
    runs = [run_delta_launches(delta_launches(*args, chained=chained, chained_lead=lead, phases=2, keep_prep=True,
                                              output_final_state=True, use_qk_l2norm_in_kernel=True, block_v=16),
                               tuple(args))
            for chained in (False, True)]
    for what, a, b in zip(("o", "final", "wy", "winv", "aqk", "coef"), *runs):
        if what == "coef":
            a, b = torch.cat([a[..., :3].flatten(), a[:, :, 0, 3].flatten()]), \
                torch.cat([b[..., :3].flatten(), b[:, :, 0, 3].flatten()])
        assert torch.equal(bits(a), bits(b)), what


def test_chained_schedule_launches_and_ready_flags():
    """The chained schedule's launches: the sweep (triggering its dependents), then the whole prep
    raising the ready flags as its programmatic dependent (48 KB reserved a program, its last
    program waiting for the sweep), then the replay launch; run_delta_launches puts the prep first
    wherever the prep's launch cannot be programmatic (here: the interpreter). After a call every
    chunk's flag of every value head is up, and the slots no chunk has are left at zero."""
    B, T, HV = 2, 300, 4
    q, k, v, g, beta, _ = gdn_inputs(B, T, 2, HV, 16, 24)
    plan_ = delta_launches(*f32(q, k, v, g, beta), chained=True, phases=3, output_final_state=True)
    names = [getattr(s.kernel, "fn", s.kernel).__name__ for s in plan_.steps]
    assert names == ["chunk_delta_sweep_kernel", "chunk_delta_prep_kernel", "chunk_delta_sweep_kernel"]
    sweep, prep, replay = plan_.steps
    assert plan_.chained == 0 and sweep.kwargs["trigger_dependents"] == 1 and sweep.kwargs["PASS"] == 0
    assert prep.kwargs["READY"] and prep.kwargs["wait_primary"] == 1 and prep.programmatic
    assert prep.min_shared == 48 * 1024 and prep.kwargs["chunk_span"] == 5
    assert replay.kwargs["REPLAY"] and replay.programmatic and "CHAINED" not in replay.kwargs
    assert launch_delta._chained_order(plan_.steps, 0) == [prep, sweep, replay]
    slots = (B * T) // 64 + B
    ready = torch.zeros(slots, HV, dtype=torch.int32, device=DEVICE)
    run_delta_launches(plan_, (*f32(q, k, v, g, beta),), given={"ready": ready})
    chunk_slots = [(n * T + c * 64) // 64 + n for n in range(B) for c in range(-(-T // 64))]
    want = torch.zeros(slots, HV, dtype=torch.int32)
    want[chunk_slots] = 1
    assert torch.equal(ready.cpu(), want)


@pytest.mark.parametrize("B,T,lead,lead_chunks", [(2, 300, 0.3, 2), (1, 640, 0.17, 2), (3, 130, 0.99, 2),
                                                  (1, 300, 0.05, 0)])
def test_chained_lead_prepares_the_first_chunks_before_the_sweep(B, T, lead, lead_chunks):
    """With a lead, the first round(chunks x lead) chunks (at most all but one; none where that
    rounds to 0) of every sequence are prepared by a launch of their own before the sweep, each of
    its programs letting the sweep (now its programmatic dependent) launch as it starts; the rest
    beside the sweep as before. Both preps go chunk-major across the sequences (n_seq = B), and
    together they raise every chunk's flag once."""
    HV = 4
    q, k, v, g, beta, _ = gdn_inputs(B, T, 2, HV, 16, 24)
    plan_ = delta_launches(*f32(q, k, v, g, beta), chained=True, chained_lead=lead, phases=3,
                           output_final_state=True)
    chunks = -(-T // 64)
    *lead_steps, sweep, rest, replay = plan_.steps
    assert plan_.chained == len(lead_steps) and sweep.kwargs["trigger_dependents"] == 1
    assert sweep.programmatic == (lead_chunks > 0)
    assert len(lead_steps) == (lead_chunks > 0)
    for step in lead_steps:
        assert step.grid == (B * lead_chunks * HV,) and not step.programmatic and step.min_shared == 0
        assert (step.kwargs["chunk_lo"], step.kwargs["chunk_span"]) == (0, lead_chunks)
        assert step.kwargs["trigger_dependents"] == 1 and step.kwargs["wait_primary"] == 0
        assert step.kwargs["READY"] and step.kwargs["n_seq"] == B
    assert rest.grid == (B * (chunks - lead_chunks) * HV,) and rest.programmatic and rest.kwargs["n_seq"] == B
    assert (rest.kwargs["chunk_lo"], rest.kwargs["chunk_span"]) == (lead_chunks, chunks - lead_chunks)
    assert rest.kwargs["trigger_dependents"] == 0 and rest.kwargs["wait_primary"] == 1
    assert launch_delta._chained_order(plan_.steps, plan_.chained) == lead_steps + [rest, sweep, replay]
    slots = (B * T) // 64 + B
    ready = torch.zeros(slots, HV, dtype=torch.int32, device=DEVICE)
    run_delta_launches(plan_, (*f32(q, k, v, g, beta),), given={"ready": ready})
    chunk_slots = [(n * T + c * 64) // 64 + n for n in range(B) for c in range(chunks)]
    want = torch.zeros(slots, HV, dtype=torch.int32)
    want[chunk_slots] = 1
    assert torch.equal(ready.cpu(), want)


class _Driven:  # a direct launch through the driver (launches_programmatically's test)
    driver = object()


def test_chained_order_keeps_the_sweep_first_only_for_programmatic_launches(monkeypatch):
    """The sweep goes first only where both launches go through the driver, so that the prep runs as
    its programmatic dependent beside it; a missing direct launch (a first call), Triton's launcher
    (no driver), a profiler's hook or CUDA_LAUNCH_BLOCKING put the prep first, as the sweep would
    otherwise wait on a prep held until its end."""
    from recurscan.launch.delta import Step
    from recurscan.runtime import launcher
    sweep, prep, replay = (Step(None, (1,), {}, {}) for _ in range(3))
    steps = [sweep, prep, replay]
    monkeypatch.setattr(launch_delta, "INTERPRET", False)
    monkeypatch.setattr(launcher, "_hooked", lambda: False)
    assert launch_delta._chained_order(steps, 0) == [prep, sweep, replay]  # no direct launches yet
    sweep.direct, prep.direct = _Driven(), _Driven()
    assert launch_delta._chained_order(steps, 0) == steps
    prep.direct = type("Fallback", (), {"driver": None})()
    assert launch_delta._chained_order(steps, 0) == [prep, sweep, replay]
    prep.direct = _Driven()
    monkeypatch.setattr(launcher, "_hooked", lambda: True)
    assert launch_delta._chained_order(steps, 0) == [prep, sweep, replay]
    monkeypatch.setattr(launcher, "_hooked", lambda: False)
    monkeypatch.setattr(launch_delta, "_LAUNCH_BLOCKING", True)
    assert launch_delta._chained_order(steps, 0) == [prep, sweep, replay]


def test_chained_schedule_only_where_it_applies():
    """Varlen input, segments and the Gated Delta Product (M = 2) are not chained: their launches
    are those of the same shape without it, and their bits the same."""
    q, k, v, g, beta, _ = gdn_inputs(1, 200, 2, 4, 16, 24)
    args = f32(q, k, v, g, beta)
    assert delta_launches(*args, chained=True, segments=2).chained == -1
    qp, kp, vp, gp, bp = f32(*gdp_inputs(100, 2, 1, 2, 16, 16))
    assert delta_launches(qp, kp, vp, gp, bp, num_householder=2, chained=True, phases=2).chained == -1
    cu = torch.tensor([0, 70, 200], device=DEVICE)
    d = build_chunk_descriptors(cu.cpu(), 1, device=DEVICE)
    kw = dict(cu_seqlens=cu, chunk_indices_dp=d.chunk_indices_dp, output_final_state=True)
    qv, kv, vv, gv, bv = f32(*gdp_inputs(200, 1, 1, 2, 16, 16))
    assert delta_launches(qv, kv, vv, gv, bv, chained=True, **kw).chained == -1
    a = chunk_delta_fwd(qv, kv, vv, gv, bv, **kw)
    b = chunk_delta_fwd(qv, kv, vv, gv, bv, chained=True, **kw)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("kw", [{}, {"phases": 3}, {"segments": 3}, {"tma_store": True, "phases": 2},
                                {"chained": True}, {"chained": True, "chained_lead": 0.5}])
def test_every_planned_launch_names_every_kernel_argument(kw):
    """The direct launcher (runtime/launcher.py) builds its parameter block from the step's
    arguments by the kernel's argument names, defaults included: a step that leaves one to its
    default fails on the GPU's first call only, never under the interpreter."""
    q, k, v, g, beta, _ = gdn_inputs(1, 300, 2, 4, 16, 24)
    plan_ = delta_launches(*f32(q, k, v, g, beta), **kw)
    for step in plan_.steps:
        fn = getattr(step.kernel, "fn", step.kernel)
        missing = [a for a in step.kernel.arg_names if a not in step.kwargs]
        assert not missing, f"{fn.__name__}: {missing}"


def test_phases_without_initial_or_final_state_and_ignored_where_they_do_not_apply():
    """Phases with no initial state and no final state asked for (the state still passes between
    phases) equal the single pass bit for bit; varlen input and segments ignore ``phases``."""
    q, k, v, g, beta, _ = gdn_inputs(2, 200, 2, 4, 16, 24)
    args = f32(q, k, v, g, beta)
    one = chunk_delta_fwd(*args, use_qk_l2norm_in_kernel=True)
    three = chunk_delta_fwd(*args, use_qk_l2norm_in_kernel=True, phases=3)
    assert one[1] is None and three[1] is None and torch.equal(bits(one[0]), bits(three[0]))
    seg = delta_launches(*args, segments=2, phases=3)
    assert not any(s.kwargs.get("PASS") == 3 for s in seg.steps)
    cu = torch.tensor([0, 70, 200], device=DEVICE)
    qv, kv, vv, gv, bv = f32(*gdp_inputs(200, 1, 1, 2, 16, 16))
    d = build_chunk_descriptors(cu.cpu(), 1, device=DEVICE)
    kw = dict(cu_seqlens=cu, chunk_indices_dp=d.chunk_indices_dp, output_final_state=True)
    plan_ = delta_launches(qv, kv, vv, gv, bv, phases=3, **kw)
    assert len(plan_.steps) == 3  # prep, sweep, replay
    a = chunk_delta_fwd(qv, kv, vv, gv, bv, **kw)
    b = chunk_delta_fwd(qv, kv, vv, gv, bv, phases=3, **kw)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("phases", [0, -1, 2.0, True])
def test_phases_must_be_a_positive_int(phases):
    q, k, v, g, beta, _ = gdn_inputs(1, 8, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="phases"):
        delta_launches(*f32(q, k, v, g, beta), phases=phases)


@pytest.mark.parametrize("name,value", [("segments", 0), ("segments", "3"), ("segments", 2.0),
                                        ("v_product", 1), ("v_product", None), ("tma_store", "yes"), ("chained", 1),
                                        ("prep_maxnreg", 100), ("prep_maxnreg", "168"), ("prep_maxnreg", 168.0),
                                        ("chained_lead", 1.0), ("chained_lead", -0.1), ("chained_lead", True),
                                        ("chained_lead", "0.2")])
def test_launch_options_are_checked_and_named(name, value):
    q, k, v, g, beta, _ = gdn_inputs(1, 8, 1, 2, 16, 16)
    with pytest.raises(ValueError, match=name):
        delta_launches(*f32(q, k, v, g, beta), **{name: value})


def test_launches_run_on_a_plain_tuple_of_the_leading_inputs():
    """The ops' hot path hands run_delta_launches a plain tuple of DeltaInputs' first eleven
    fields (the SSD fields after them unset): the same bits as the full record, each buffer where
    the launches expect it (the H200 run at 6dc10bf found them shifted by the SSD fields)."""
    q, k, v, g, beta, S0 = gdn_inputs(1, 70, 2, 2, 16, 16)
    args = tuple(x.float().to(DEVICE) for x in (q, k, v, g, beta))
    h0 = S0[:1].float().to(DEVICE)
    launches = delta_launches(*args, initial_state=h0, output_final_state=True)
    full = run_delta_launches(launches, launch_delta.DeltaInputs(*args, initial_state=h0))
    plain = run_delta_launches(launches, args + (h0, None, None, None, None, None))
    assert all(torch.equal(a, b) for a, b in zip(full, plain))


# The forward sweep's Gluon twin (kernels/gluon/delta_sweep.py): which calls take it. Its bits
# against the Triton sweep are the GPU's (tests/gpu/test_gluon_sweep_gpu.py); its sm_90 build is
# tests/test_sm90_compile.py's.

def _twin_steps(launches):
    """``(PASS, REPLAY, "gluon" or "triton")`` of every sweep launch."""
    return [(s.kwargs["PASS"], s.kwargs["REPLAY"], "gluon" if type(s.kernel).__name__ == "GluonJITFunction" else
             "triton") for s in launches.steps if launch_delta.is_sweep_step(s)]


@pytest.mark.parametrize("case, planned", [
    ("bf16 GDN, BV 64 on one warpgroup", True), ("fp16, K = V = 64", True), ("row off", False),
    ("no usable Gluon", False), ('backend="triton"', False), ("GDP M = 2", False), ("float32", False),
    ("K = 96", False), ("V = 96", False), ("BV 128 on two warpgroups", False), ("BV 32", False),
    ("V in registers", False), ("group prep", False), ("one pass", False), ("warp-specialised", True),
    ("one pass, its warp-specialised row on", True), ("segments, the one-pass row on", False)])
def test_the_planner_gives_the_sweep_to_its_gluon_twin_only_in_scope(monkeypatch, case, planned):
    """plan.delta.gluon_forward_sweep (the Gluon rules, docs/kernels-gluon.md): a phased row of the
    twin's kind (64 value columns, one warpgroup, V a product operand), GDN, 16-bit inputs, K 64 or
    128, V a multiple of 64, Gluon usable here, its row on, the caller not forcing Triton; its
    warp-specialised form where that row is on too, chained (with the planned lead) where its row
    (GLUON_FORWARD_CHAINED) is on as well; a single pass (not segments) of that kind in the
    warp-specialised form where its own row is on."""
    import dataclasses
    from recurscan.plan import delta as plan_delta
    monkeypatch.setattr(plan_delta, "gluon_usable", lambda device: case != "no usable Gluon")
    monkeypatch.setattr(plan_delta, "GLUON_FORWARD_SWEEP",
                        dataclasses.replace(plan_delta.GLUON_FORWARD_SWEEP, on=case != "row off"))
    fp16 = case.startswith("fp16")
    given = plan_delta.DeltaShape(128 if "BV 128" in case else 32 if case == "BV 32" else 64,
                                  8 if "two warpgroups" in case else 4, 3, 4, "test",
                                  phases=1 if case.startswith(("one pass", "segments")) else 6,
                                  segments=4 if case.startswith("segments") else 1,
                                  v_product=case != "V in registers", group_prep=case == "group prep")
    monkeypatch.setattr(plan_delta, "GLUON_FORWARD_SPECIALIZED",
                        dataclasses.replace(plan_delta.GLUON_FORWARD_SPECIALIZED, on=case == "warp-specialised"))
    monkeypatch.setattr(plan_delta, "GLUON_FORWARD_SPECIALIZED_ONE_PASS",
                        dataclasses.replace(plan_delta.GLUON_FORWARD_SPECIALIZED_ONE_PASS, on="row on" in case))
    got = plan_delta.gluon_forward_sweep(
        given, householder=2 if case.startswith("GDP") else 1,
        dtype=torch.float32 if case == "float32" else torch.float16 if fp16 else torch.bfloat16,
        key_dim=96 if case == "K = 96" else 64 if fp16 else 128, value_dim=96 if case == "V = 96" else 64 if fp16 else 128,
        device=torch.device("cuda"), twin_only=case == 'backend="triton"')
    assert got.gluon_sweep is planned
    if case.startswith("one pass,"):
        assert got == dataclasses.replace(given, gluon_sweep=True, specialized=True)
    else:
        chained = case == "warp-specialised" and plan_delta.GLUON_FORWARD_CHAINED.on
        assert got == (dataclasses.replace(given, gluon_sweep=True, phase_ratio=plan_delta.GLUON_SWEEP_PHASE_RATIO,
                                           specialized=case == "warp-specialised", chained=chained,
                                           chained_lead=plan_delta.CHAINED_LEAD if chained else 0.0)
                       if planned else given)


def test_the_warp_specialised_sweep_with_the_wy_step_takes_calls_with_outputs_and_the_twin_the_rest():
    """DeltaShape.specialized with the WY step (kernels/gluon/gla_sweep_specialized.py): the single
    pass and every phase launch it under its register cap, the replay the Triton kernel; chunk
    states in the inputs' dtype too, and a training forward keeping its prep; float32 chunk states,
    the training forward's checkpoints and the backward's recompute (no outputs, U stored; unless
    ``recompute_specialized``) the twin; in segments, a ValueError naming the field."""
    import dataclasses
    from recurscan.launch.delta_backward import build_delta_backward
    from recurscan.plan.delta import DELTA_BACKWARD_LAUNCH, DeltaShape
    q, k, v = (torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    g, beta = torch.zeros(1, 256, 2), torch.ones(1, 256, 2, dtype=torch.bfloat16)
    ws = dict(block_v=64, num_warps=4, num_stages=3, tma_store=True, gluon_sweep=True, specialized=True)
    W, G, J = "gluon_gla_sweep_specialized_kernel", "gluon_sweep_kernel", "chunk_delta_sweep_kernel"
    cap = launch_delta.SPECIALIZED_MAXNREG

    def sweeps(launches):
        return [(getattr(s.kernel, "fn", s.kernel).__name__, s.kwargs["PASS"], s.options.get("maxnreg"))
                for s in launches.steps if launch_delta.is_sweep_step(s)]
    assert sweeps(delta_launches(q, k, v, g, beta, **ws)) == [(W, 0, cap), (J, 0, None)]
    assert sweeps(delta_launches(q, k, v, g, beta, phases=3, **ws)) == [(W, 3, cap)] * 3 + [(J, 0, None)]
    assert sweeps(delta_launches(q, k, v, g, beta, return_chunk_states=True, chunk_states_dtype=torch.bfloat16,
                                 **ws))[0] == (W, 0, cap)
    assert sweeps(delta_launches(q, k, v, g, beta, return_chunk_states=True, **ws))[0] == (G, 0, None)
    assert sweeps(delta_launches(q, k, v, g, beta, checkpoint_chunks=2, **ws))[0] == (G, 0, None)
    # the training forward that keeps its prep and no checkpoints (B1's planned row) takes it too
    assert sweeps(delta_launches(q, k, v, g, beta, keep_prep=True, phases=3, **ws))[0] == (W, 3, cap)
    backward_shape = dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1], recompute_twin=True)
    backward = build_delta_backward(q, k, v, g, beta, torch.zeros_like(v), None, scale=1.0, initial_state=None,
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=None, chunk_indices=None,
                                    chunk_offsets=None, backward_shape=backward_shape,
                                    shape=DeltaShape(64, 4, 3, 4, "test", gluon_sweep=True, specialized=True))
    assert [name for name, *_ in sweeps(backward.forward)] == [G]
    with pytest.raises(ValueError, match="specialized"):
        delta_launches(q, k, v, g, beta, segments=2, **ws)


@pytest.mark.parametrize("case", ["one pass", "phases on the twin", "from checkpoints", "BV 128 on two warpgroups",
                                  "V in registers", "its row off"])
def test_the_recompute_takes_the_warp_specialised_sweep_only_from_the_sequences_start(case):
    """DeltaBackwardShape.recompute_specialized: the backward's recompute on the warp-specialised
    sweep (no outputs, the chunk states, U and lam o K S stored: OUTPUTS off, STORE_U on), in the
    forward's passes (one, or its phases), under the kernel's register cap; a forward of another
    kind (BV 128, V in registers) or checkpoints (a second pass over segments) keep the Triton sweep."""
    import dataclasses
    from recurscan.launch.delta_backward import build_delta_backward
    from recurscan.plan.delta import DELTA_BACKWARD_LAUNCH, DeltaShape
    q, k, v = (torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    g, beta = torch.zeros(1, 256, 2), torch.ones(1, 256, 2, dtype=torch.bfloat16)
    shape = {"BV 128 on two warpgroups": DeltaShape(128, 8, 3, 4, "test", tma_store=True),
             "V in registers": DeltaShape(64, 4, 2, 4, "test", v_product=False),
             "phases on the twin": DeltaShape(64, 4, 3, 4, "test", tma_store=True, phases=3, gluon_sweep=True,
                                              specialized=True, phase_ratio=0.8)}.get(
        case, DeltaShape(64, 4, 3, 4, "test", tma_store=True))
    backward_shape = dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1], recompute_specialized=case != "its row off",
                                         recompute_twin=case == "phases on the twin")
    backward = build_delta_backward(q, k, v, g, beta, torch.zeros_like(v), None, scale=1.0, initial_state=None,
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=None, chunk_indices=None,
                                    chunk_offsets=None, backward_shape=backward_shape, shape=shape,
                                    checkpoint_chunks=2 if case == "from checkpoints" else 0)
    sweeps = [s for s in backward.forward.steps if launch_delta.is_sweep_step(s)]
    names = [getattr(s.kernel, "fn", s.kernel).__name__ for s in sweeps]
    if case in ("one pass", "phases on the twin"):
        assert names == ["gluon_gla_sweep_specialized_kernel"] * (3 if case.startswith("phases") else 1)
        assert all(s.kwargs["STORE_U"] and not s.kwargs["OUTPUTS"] and s.kwargs["STORE_CHUNK_STATES"] and
                   s.options["maxnreg"] == launch_delta.SPECIALIZED_MAXNREG for s in sweeps)
        assert [s.kwargs["PASS"] for s in sweeps] == ([3] * 3 if case.startswith("phases") else [0])
    else:
        assert names == ["chunk_delta_sweep_kernel"]


def test_the_gluon_sweep_runs_its_passes_and_the_triton_kernel_the_rest():
    """With ``gluon_sweep``: the single pass, every phase and a segmented sweep's second pass launch
    the twin; a segmented sweep's first pass and the replay stay the Triton kernel's. Inputs the
    twin's bulk copies cannot read from their base (q not 16-byte aligned) or outputs its bulk
    stores cannot take, and states whose offsets pass int32, take the Triton kernel throughout."""
    q, k, v = (torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    g, beta = torch.zeros(1, 256, 2), torch.ones(1, 256, 2, dtype=torch.bfloat16)
    twin = dict(block_v=64, num_warps=4, num_stages=3, tma_store=True, gluon_sweep=True)
    G, J = "gluon", "triton"
    assert _twin_steps(delta_launches(q, k, v, g, beta, **twin)) == [(0, False, G), (0, True, J)]
    assert _twin_steps(delta_launches(q, k, v, g, beta, phases=3, **twin)) == [(3, False, G)] * 3 + [(0, True, J)]
    assert _twin_steps(delta_launches(q, k, v, g, beta, segments=2, **twin)) == \
        [(1, False, J), (2, False, G), (2, True, J)]
    shifted = torch.zeros(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # 2 bytes past an aligned base
    assert {kind for *_, kind in _twin_steps(delta_launches(shifted, k, v, g, beta, **twin))} == {J}
    o = torch.zeros(1, 256, 2, 130, dtype=q.dtype)[..., :128]  # rows of 130: not 16-byte strides
    final = torch.zeros(1, 2, 128, 128)
    assert {kind for *_, kind in _twin_steps(delta_launches(q, k, v, g, beta, output_final_state=True,
                                                            out_views=(o, final), **twin))} == {J}
    huge = torch.empty_strided((1, 2, 128, 128), (0, 0, 2 ** 25, 1), device="meta")  # only its strides are read
    assert {kind for *_, kind in _twin_steps(delta_launches(q, k, v, g, beta, initial_state=huge, **twin))} == {J}


@pytest.mark.parametrize("what", ["M = 2", "float32", "block_v 32", "8 warps", "V in registers", "K = 96",
                                  "gated linear attention with calm gates"])
def test_a_gluon_sweep_outside_its_scope_is_refused(what):
    """A hand-made DeltaShape asking for the twin where it cannot run: a ValueError naming the
    field, before anything is launched."""
    M = 2 if what == "M = 2" else 1
    dtype = torch.float32 if what == "float32" else torch.bfloat16
    K = 96 if what == "K = 96" else 128
    q, k = torch.zeros(1, 64, 2, K, dtype=dtype), torch.zeros(1, 64 * M, 2, K, dtype=dtype)
    v = torch.zeros(1, 64 * M, 2, 128, dtype=dtype)
    gla = what.startswith("gated linear attention")
    beta = None if gla else torch.ones(1, 64 * M, 2, dtype=dtype)
    shape = dict(block_v=32 if what == "block_v 32" else 64, num_warps=8 if what == "8 warps" else 4,
                 v_product=what != "V in registers", num_stages=2 if gla else 3, gluon_sweep=True, group_prep=gla,
                 calm_gates=gla)
    extra = dict(wy=False) if gla else dict(num_householder=M)
    with pytest.raises(ValueError, match="gluon_sweep"):
        delta_launches(q, k, v, torch.zeros(1, 64, 2), beta, **shape, **extra)


@pytest.mark.parametrize("every", [0, 2])
@pytest.mark.parametrize("twin", [True, False])
def test_the_backward_recompute_takes_the_forward_sweeps_twin_where_its_shape_says(every, twin):
    """The backward's recompute, built from a forward shape with ``gluon_sweep``, runs its sweep
    (no outputs, U and lam o K S stored; from the sequence's start, or a second pass from the
    forward's checkpoints) on the twin where the backward shape's ``recompute_twin`` says so, else
    on the Triton sweep in the Triton sweep's phases."""
    import dataclasses
    from recurscan.launch.delta_backward import build_delta_backward
    from recurscan.plan.delta import DELTA_BACKWARD_LAUNCH, DeltaShape
    q, k, v, do = (torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(4))
    beta = torch.ones(1, 256, 2, dtype=torch.bfloat16)
    shape = DeltaShape(64, 4, 3, 4, "test", gluon_sweep=True)
    backward_shape = dataclasses.replace(DELTA_BACKWARD_LAUNCH[1][1], recompute_twin=twin)
    launches = build_delta_backward(q, k, v, torch.zeros(1, 256, 2), beta, do, None, scale=1.0, initial_state=None,
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=None, chunk_indices=None,
                                    chunk_offsets=None, shape=shape, backward_shape=backward_shape,
                                    checkpoint_chunks=every)
    (sweep,) = [s for s in launches.forward.steps if launch_delta.is_sweep_step(s)]
    assert (type(sweep.kernel).__name__ == "GluonJITFunction") is twin
    assert (sweep.kwargs["PASS"], sweep.kwargs["OUTPUTS"], sweep.kwargs["STORE_U"]) == (2 if every else 0, False, True)
