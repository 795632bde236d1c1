"""The fused prefill's parts that run on the CPU (the fused kernel itself is GPU only: its sm_90 compile
is in test_sm90_compile.py, its comparison with its twin in tests/gpu/test_fused_prefill_gpu.py):

- the chunk vectors' pass (kernels/delta/chunk_vectors.py) equals its torch reference below, dense
  and varlen (partial and empty sequences), under GVA and without a decay, and marks exactly the
  chunks the fused kernel must not compute (and so does benchmarks/chunk_vectors_forms.py's looped
  form, a run of chunks a program, to the bit); with DINV it also writes the inverses of the WY
  matrix's diagonal 16 x 16 blocks, each within 1e-3 of the float64 inverse, and the same vectors;
- the flagged token loop (launch/delta_fused.py) recomputes the flagged value columns as the
  oracle does, from and into an initial and final state or a state cache, and leaves every other
  column, pair and slot alone;
- the planner takes the fused prefill where pairs fill the SMs, within its scope, never where the
  caller forced the Triton kernels; and a fused shape the interpreter cannot run is the row's launch.
"""
import pytest
import torch

from recurscan.descriptors import CHUNK_SIZE, build_chunk_descriptors
from recurscan.kernels.delta.chunk_vectors import VECTOR_ROWS, chunk_vectors_grid, chunk_vectors_kernel
from recurscan.launch.delta import CALL_NAMES, Step, launch_steps
from recurscan.launch.delta_fused import flagged_token_loop
from recurscan.reference.delta import gated_delta_rule_naive

from tests.helpers.tolerances import bits

BT = CHUNK_SIZE
LOG2E = 1.4426950408889634


def chunk_vectors_reference(q, k, g, beta, cu_seqlens):
    """{slot: [HV, 4, 64]} of every chunk of every sequence, as the module docstring of
    kernels/delta/chunk_vectors.py defines them (slot = (bos + 64 c) // 64 + n)."""
    B, T, H, K = q.shape
    HV = beta.shape[2]
    q, k, beta = (x.reshape(B * T, *x.shape[2:]).float() for x in (q, k, beta))
    g = torch.zeros(B * T, HV) if g is None else g.reshape(B * T, HV).float()
    bounds = [(n * T, (n + 1) * T) for n in range(B)] if cu_seqlens is None else \
        list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()))
    out = {}
    for n, (bos, eos) in enumerate(bounds):
        for c in range(-(-(eos - bos) // BT)):
            rows = torch.arange(bos + c * BT, bos + (c + 1) * BT)
            live = rows < eos
            rows = rows.clamp(max=B * T - 1)
            pad = lambda x: torch.where(live.view(-1, *([1] * (x.dim() - 1))), x[rows], 0.0)  # noqa: E731
            kt, qt, gt, bt = pad(k), pad(q), pad(g), pad(beta)
            k_sq = kt.square().sum(-1)  # [64, H]
            rk, rq = torch.rsqrt(k_sq + 1e-6), torch.rsqrt(qt.square().sum(-1) + 1e-6)
            vec = torch.empty(HV, VECTOR_ROWS, BT)
            for hv in range(HV):
                h = hv // (HV // H)
                gc = gt[:, hv].cumsum(0) * LOG2E
                b = bt[:, hv]
                bad = ~torch.isfinite(gt[:, hv]) | ~torch.isfinite(b) | ~torch.isfinite(k_sq[:, h]) | (b < 0) | \
                    (b * k_sq[:, h] * rk[:, h] ** 2 > 2)
                vec[hv, 0] = torch.full_like(gc, float("nan")) if bool(bad.any()) else gc
                vec[hv, 1], vec[hv, 2], vec[hv, 3] = b, rk[:, h], rq[:, h]
            out[(bos + c * BT) // BT + n] = vec
    return out


def run_chunk_vectors(q, k, g, beta, cu_seqlens, dinv=None):
    B, T, H, K = q.shape
    HV = beta.shape[2]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    vec = torch.full(((B * T) // BT + N, HV, VECTOR_ROWS, BT), -7.0)  # a value no chunk writes
    if cu_seqlens is None:
        ci, n_prep = q, B * -(-T // BT)
    else:
        ci = build_chunk_descriptors(cu_seqlens).chunk_indices
        n_prep = ci.shape[0]
    chunk_vectors_kernel[chunk_vectors_grid(n_prep, H)](q, k, g if g is not None else q, beta, vec,
                                                        cu_seqlens if cu_seqlens is not None else q, ci, T,
                                                        N if cu_seqlens is not None else 0, H=H, HV=HV, K=K, BT=BT,
                                                        IS_VARLEN=cu_seqlens is not None, HAS_G=g is not None,
                                                        DINV=dinv is not None, dinv=dinv)
    return vec


def inputs(B, T, H, HV, K=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16()
    g = torch.nn.functional.logsigmoid(rn(B, T, HV) + 2.0)
    beta = torch.sigmoid(rn(B, T, HV)).bfloat16()
    return q, k, g, beta


CASES = {
    "dense, H = HV": dict(B=2, T=2 * BT, H=2, HV=2),
    "dense GVA, a partial last chunk": dict(B=2, T=BT + 20, H=1, HV=4),
    "varlen: empty, one-token and partial sequences": dict(B=1, T=300, H=2, HV=4, cu=[0, 0, 1, 64, 65, 65, 300]),
    "no decay": dict(B=1, T=BT, H=1, HV=2, no_g=True),
    "groups of three value heads": dict(B=1, T=BT + 3, H=2, HV=6),
    "hostile rows": dict(B=2, T=2 * BT, H=1, HV=2, hostile=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_chunk_vectors_match_their_reference(case):
    c = CASES[case]
    q, k, g, beta = inputs(c["B"], c["T"], c["H"], c["HV"])
    if c.get("no_g"):
        g = None
    if c.get("hostile"):  # each marks its own chunk and value head only
        g[0, 3, 0] = float("-inf")  # a reset
        beta[0, BT + 5, 1] = -0.5  # no contraction
        beta[1, 7, 0] = 2.5  # a normalised key's |k|^2 is 1 less 1e-6 / |k|^2: no contraction
        k[1, BT + 9, 0] = float("nan")  # a non-finite key: both value heads of its chunk
        g[1, BT + 10, 1] = float("nan")
    cu = None if "cu" not in c else torch.tensor(c["cu"], dtype=torch.int32)
    got = run_chunk_vectors(q, k, g, beta, cu)
    want = chunk_vectors_reference(q, k, g, beta, cu)
    for slot in range(got.shape[0]):
        if slot in want:
            torch.testing.assert_close(got[slot], want[slot], rtol=1e-5, atol=1e-5, equal_nan=True)
        else:  # no stray writes
            assert bool((got[slot] == -7.0).all()), slot
    if c.get("hostile"):
        marked = {(s, hv) for s, v in want.items() for hv in range(v.shape[0]) if bool(v[hv, 0].isnan().all())}
        assert marked == {(0, 0), (1, 1), (3, 0), (4, 0), (4, 1)}, marked  # slots: n T / 64 + c + n


@pytest.mark.parametrize("case", ["dense, H = HV", "dense GVA, a partial last chunk",
                                  "varlen: empty, one-token and partial sequences", "groups of three value heads"])
def test_the_pass_gives_the_inverses_of_the_wy_matrix_diagonal_blocks(case):
    """DINV (plan.delta.FUSED_DIAGONAL_FROM_PASS): dinv[slot, hv] holds, row i, row i % 16 of
    (I + A_ww)^-1 for block w = i // 16 of A = diag(beta) strictLower(K K^T) on the normalised keys,
    within 1e-3 of the float64 inverse (its products' operands are fp16; 3.1e-4 at most here); the
    vectors are those of the pass without it; no other slot is written."""
    c = CASES[case]
    q, k, g, beta = inputs(c["B"], c["T"], c["H"], c["HV"])
    cu = None if "cu" not in c else torch.tensor(c["cu"], dtype=torch.int32)
    B, T, H, K = q.shape
    HV = beta.shape[2]
    N = B if cu is None else cu.numel() - 1
    dinv = torch.full(((B * T) // BT + N, HV, BT, 16), -7.0, dtype=torch.float16)
    vec_plain = run_chunk_vectors(q, k, g, beta, cu)
    vec = run_chunk_vectors(q, k, g, beta, cu, dinv=dinv)
    assert torch.equal(bits(vec), bits(vec_plain))
    want = chunk_vectors_reference(q, k, g, beta, cu)
    kf, bf = k.reshape(B * T, H, K).double(), beta.reshape(B * T, HV).double()
    bounds = [(n * T, (n + 1) * T) for n in range(B)] if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist()))
    for n, (bos, eos) in enumerate(bounds):
        for ch in range(-(-(eos - bos) // BT)):
            slot = (bos + ch * BT) // BT + n
            rows = torch.arange(bos + ch * BT, bos + (ch + 1) * BT)
            live = rows < eos
            kt = torch.where(live[:, None, None], kf[rows.clamp(max=B * T - 1)], 0.0)
            bt = torch.where(live[:, None], bf[rows.clamp(max=B * T - 1)], 0.0)
            kn = kt * torch.rsqrt(kt.square().sum(-1, keepdim=True) + 1e-6)
            for hv in range(HV):
                h = hv // (HV // H)
                A = torch.tril(bt[:, hv, None] * (kn[:, h] @ kn[:, h].T), -1)
                for w in range(BT // 16):
                    blk = slice(16 * w, 16 * (w + 1))
                    inv = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + A[blk, blk])
                    torch.testing.assert_close(dinv[slot, hv, blk].double(), inv, rtol=1e-3, atol=1e-3)
    written = {s_ for s_ in range(dinv.shape[0]) if not bool((dinv[s_] == -7.0).all())}
    assert written == set(want), (written, set(want))


def _token_loop_values(q, k, v, g, beta, o, h0, final, cu, flags, state=None, slots=None):
    named = dict(q=q, k=k, v=v, g=g, beta=beta, o=o, initial_state=h0, final=final, cu_seqlens=cu, flags=flags,
                 state=state, state_indices=slots)
    return tuple(named.get(n) for n in CALL_NAMES)


@pytest.mark.parametrize("cache", [False, True], ids=["initial and final state", "state cache"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_the_flagged_token_loop_recomputes_flagged_columns_only(varlen, cache):
    """Flags in two (sequence, value head) pairs' rows, each in value column 5: their first block of
    32 columns (the interpreter's tile) is the oracle's, outputs and state (in the cache, at the
    sequence's slot); every other block, pair and slot is untouched (NaN-poisoned, or its bits)."""
    B, T, H, HV, K, V = (1, 90, 1, 2, 32, 64) if varlen else (2, 40, 1, 2, 32, 64)
    cu = torch.tensor([0, 30, 30, 90], dtype=torch.int32) if varlen else None
    N = 3 if varlen else B
    q, k, g, beta = inputs(B, T, H, HV, K, seed=1)
    v = torch.randn(B, T, HV, V, generator=torch.Generator().manual_seed(2)).bfloat16()
    h0 = torch.randn(N, HV, K, V) * 0.1
    o = torch.full((B, T, HV, V), float("nan"), dtype=torch.bfloat16)
    final = torch.full((N, HV, K, V), float("nan"))
    state = slots = None
    if cache:  # slots in reverse order, two more than the sequences
        slots = torch.arange(N, dtype=torch.int32).flip(0) + 2
        state = torch.randn(N + 2, HV, K, V) * 0.1
        h0 = state[slots.long()]
        state0 = state.clone()
    flags = torch.zeros(N * HV, V, dtype=torch.int32)
    flagged = [(0, 1), (N - 1, 0)]
    for n, hv in flagged:
        flags[n * HV + hv, 5] = 1
    step = flagged_token_loop(Step, q, v, H=H, HV=HV, K=K, V=V, N=N, T=T, varlen=varlen, scale=0.3, has_g=True,
                              has_h0=not cache, store_final=not cache,
                              s0=state.stride() if cache else h0.stride(), o_strides=(HV * V, V),
                              ht_strides=(HV * K * V, K * V), beta_name="beta", n_slots=N + 2 if cache else 0)
    launch_steps([step], _token_loop_values(q, k, v, g, beta, o, None if cache else h0, None if cache else final,
                                            cu, flags, state, slots))
    want_o, want_s = gated_delta_rule_naive(*(x.double() for x in (q, k, v, g, beta)), scale=0.3,
                                            initial_state=h0.double(), use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    bounds = [(0, 30), (30, 30), (30, 90)] if varlen else None
    block, rest = slice(0, 32), slice(32, 64)
    for n in range(N):
        got_s = state[int(slots[n])] if cache else final[n]
        for hv in range(HV):
            if varlen:
                got_o, ref_o = o[0, bounds[n][0]:bounds[n][1], hv], want_o[0, bounds[n][0]:bounds[n][1], hv]
            else:
                got_o, ref_o = o[n, :, hv], want_o[n, :, hv]
            if (n, hv) in flagged:
                torch.testing.assert_close(got_o[:, block].double(), ref_o[:, block], rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(got_s[hv, :, block].double(), want_s[n, hv, :, block], rtol=1e-4,
                                           atol=1e-4)
            assert bool((got_o[:, rest] if (n, hv) in flagged else got_o).isnan().all()), (n, hv)
            untouched = got_s[hv, :, rest] if (n, hv) in flagged else got_s[hv]
            if cache:
                before = state0[int(slots[n]), hv]
                assert torch.equal(untouched, before[:, rest] if (n, hv) in flagged else before), (n, hv)
            else:
                assert bool(untouched.isnan().all()), (n, hv)
    if cache:
        assert torch.equal(state[:2], state0[:2])  # slots no sequence names


def test_every_fused_launch_names_every_kernel_argument():
    """As the planned launches must (the direct launcher reads every argument by name, defaults
    included): the fused prefill's three launches, built as for a GPU call (the interpreter's
    fallback bypassed)."""
    from recurscan.launch import delta as launch_delta
    from recurscan.launch.delta_fused import fused_launch_steps
    q, k, g, beta = inputs(2, 70, 1, 2, K=128)
    v = torch.zeros(2, 70, 2, 128, dtype=torch.bfloat16)
    for h0, final, n_slots in ((False, False, 0), (True, True, 0), (False, False, 4)):
        _, steps = fused_launch_steps(launch_delta.Step, q, v, H=1, HV=2, K=128, V=128, N=2, T=70, scale=0.1,
                                      varlen=False, n_prep=4, has_g=True, has_h0=h0, store_final=final,
                                      s0=(2 * 128 * 128, 128 * 128, 128, 1), o_strides=(256, 128),
                                      ht_strides=(2 * 128 * 128, 128 * 128), beta_name="beta", n_slots=n_slots)
        assert len(steps) == 3
        for step in steps:
            missing = [a for a in step.kernel.arg_names if a not in step.kwargs]
            assert not missing, f"{step.kernel}: {missing}"


def test_the_fused_kernel_takes_only_the_calls_it_can():
    """fused_call_ok (launch/delta_fused.py): the row runs for 32-bit inputs, K or V other than 128,
    a decay per key, beta per value column, an output view its bulk stores cannot take, or a cache
    slot whose offsets pass int32; strided inputs are fine (the launch makes them contiguous)."""
    from recurscan.launch.delta_fused import fused_call_ok
    q, k, g, beta = inputs(2, 64, 1, 2, K=128)
    v = torch.zeros(2, 64, 2, 128, dtype=torch.bfloat16)
    assert fused_call_ok(q, k, v, g, beta, None, None, 2)
    assert fused_call_ok(q, k, v, None, None, None, None, 2)
    assert fused_call_ok(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, g, beta, None, None, 2)
    assert not fused_call_ok(q.float(), k.float(), v.float(), g, beta, None, None, 2)
    assert not fused_call_ok(q[..., :64], k[..., :64], v, g, beta, None, None, 2)
    assert not fused_call_ok(q, k, v[..., :64], g, beta, None, None, 2)
    assert not fused_call_ok(q, k, v, g[..., None].expand(2, 64, 2, 128), beta, None, None, 2)
    assert not fused_call_ok(q, k, v, g, beta[..., None].expand(2, 64, 2, 128), None, None, 2)
    final = torch.zeros(2, 2, 128, 128)
    assert fused_call_ok(q, k, v, g, beta, None, (torch.zeros(2, 64, 3, 128, dtype=torch.bfloat16)[:, :, :2], final), 2)
    odd = torch.zeros(2 * 64 * 2 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 64, 2, 128)  # base 2 bytes off
    assert not fused_call_ok(q, k, v, g, beta, None, (odd, final), 2)
    assert fused_call_ok(q, k, v, g, beta, torch.zeros(4, 2, 128, 128), None, 2)
    # 127 key rows 2^25 elements apart: a slot's offsets past int32
    huge = torch.empty(4, 2, 128, 128, device="meta").as_strided((4, 2, 128, 128), (0, 0, 2 ** 25, 1))
    assert not fused_call_ok(q, k, v, g, beta, huge, None, 2)


def test_the_planner_takes_the_fused_prefill_where_pairs_fill_the_sms(monkeypatch):
    from recurscan.plan import delta as plan_delta
    from recurscan.problem import delta_problem
    monkeypatch.setattr(plan_delta, "gluon_usable", lambda device: True)
    monkeypatch.setattr(plan_delta, "sm_count", lambda device: 132)
    cpu = torch.device("cpu")

    def planned(B, HV, K=128, dtype=torch.bfloat16, gluon=True, **kw):
        q, k = (torch.zeros(B, 128, 16, K, dtype=dtype) for _ in range(2))
        v = torch.zeros(B, 128, HV, 128, dtype=dtype)
        problem = delta_problem(q, k, v, torch.zeros(B, 128, HV), torch.zeros(B, 128, HV, dtype=dtype), **kw)
        return plan_delta.delta_shape(problem, cpu, gluon=gluon).fused

    assert planned(2, 64) and planned(8, 16)  # 128 pairs, 0.97 an SM
    assert not planned(4, 16)  # 64 pairs
    assert not planned(2, 64, gluon=False)  # backend="triton"
    assert not planned(2, 64, K=64)
    assert not planned(2, 64, dtype=torch.float32)
    cache = dict(state=torch.zeros(4, 64, 128, 128), state_indices=torch.arange(2, dtype=torch.int32))
    assert planned(2, 64, **cache) == plan_delta.FUSED_PREFILL_CACHE.on  # serving in place: where proven
    monkeypatch.setattr(plan_delta, "FUSED_PREFILL_CACHE", plan_delta.GluonTwinRow(True, "test"))
    assert planned(2, 64, **cache)
    monkeypatch.setattr(plan_delta, "FUSED_PREFILL_CACHE", plan_delta.GluonTwinRow(False, "test"))
    assert not planned(2, 64, **cache)


def test_a_fused_shape_the_interpreter_cannot_run_is_the_rows_launch():
    from recurscan.launch.delta import run_delta_launches
    from tests.helpers.launches import delta_launches
    q, k, g, beta = inputs(2, 70, 1, 2, K=16)
    v = torch.randn(2, 70, 2, 16, generator=torch.Generator().manual_seed(3)).bfloat16()
    runs = []
    for fused in (True, False):
        launches = delta_launches(q, k, v, g, beta, fused=fused, use_qk_l2norm_in_kernel=True,
                                  output_final_state=True)
        assert not any("gluon" in getattr(s.kernel, "__name__", type(s.kernel).__name__).lower() or
                       type(s.kernel).__name__ == "GluonJITFunction" for s in launches.steps)
        runs.append(run_delta_launches(launches, (q, k, v, g, beta)))
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(*runs))


@pytest.mark.parametrize("chunks", [1, 3])
def test_the_looped_chunk_vectors_form_gives_the_packages_vectors(chunks):
    """benchmarks/chunk_vectors_forms.py's looped form (a program over `chunks` consecutive chunks of
    one q/k head, the last block partly past the stream's end): the package's vectors, no stray write."""
    from benchmarks.chunk_vectors_forms import chunk_vectors_looped_kernel
    B, T, H, HV = 2, 2 * BT + 20, 2, 4
    q, k, g, beta = inputs(B, T, H, HV)
    want = run_chunk_vectors(q, k, g, beta, None)
    got = torch.full_like(want, -7.0)
    n = B * -(-T // BT)
    chunk_vectors_looped_kernel[(-(-n // chunks) * H,)](q, k, g, beta, got, T, n, H=H, HV=HV, K=q.shape[-1], BT=BT,
                                                       CHUNKS=chunks, NUM_STAGES=2)
    assert torch.equal(bits(got), bits(want))
