"""The GLA backward's dg launch as its Gluon twin (kernels/gluon/gla_backward_dg.py, and its
warp-specialised form, kernels/gluon/gla_backward_dg_specialized.py) against the
Triton kernel it twins (kernels/gla/backward.py's chunk_simple_gla_bwd_grads_kernel, PART 2, four
value heads a program on 8 warps), both launched directly on the same inputs: a group of value
heads per query/key head, decays with resets (-inf) and a NaN, dense with a partial last chunk and
varlen with a one-token sequence. dg agrees to float32 rounding (the reductions' order follows the
layout) and is written on the same rows; and SSD's training gradients with the twin planned agree
with the Triton kernel's. Run: ``python -m pytest -m gpu tests/gpu/test_gluon_gla_dg_gpu.py``."""
import dataclasses

import pytest
import torch
import triton.language as tl

from tests.helpers.tolerances import relative_rms

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gluon_only")]

DEV = "cuda"
BT = 64


def dg_of(gluon: bool, q, k, v, g, do, states, dstates, cu, chunk_indices, chunk_offsets, n_cs_rows,
          specialized: bool = False):
    """dg ``[B * T, HV]`` (NaN where not written) from the Triton kernel's PART 2 or its twin (with
    ``specialized``, warp-specialised: kernels/gluon/gla_backward_dg_specialized.py, launched as
    launch.gla launches it)."""
    from recurscan.kernels.gla.backward import chunk_simple_gla_bwd_grads_kernel
    from recurscan.kernels.gluon.gla_backward_dg import gluon_gla_bwd_dg_kernel
    from recurscan.kernels.gluon.gla_backward_dg_specialized import gluon_gla_bwd_dg_specialized_kernel
    from recurscan.launch.gla import DG_SPECIALIZED_MAXNREG
    from recurscan.plan.device import sm_count
    from recurscan.runtime.launcher import scratch_allocator
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu is None else cu.numel() - 1
    dg = torch.full((B, T, HV), float("nan"), device=DEV)
    z = torch.zeros(1, device=DEV)
    args = dict(q=q, k=k, v=v, g=g, do=do, states=states, dstates=dstates, dq=z, dk=z, dg=dg, scratch=z,
                cu_seqlens=cu if cu is not None else z, chunk_indices=chunk_indices if cu is not None else z,
                chunk_offsets=chunk_offsets if cu is not None else z, T=T, n_seq=N, scale=K ** -0.5,
                n_cs_rows=n_cs_rows, step=z, H=H, HV=HV, K=K, V=V, BT=BT, BK=K, BV=V, IS_VARLEN=cu is not None, HAS_G=True,
                DOT_PRECISION="tf32", DT=tl.bfloat16, PER_KEY=False, HEADS=4, PART=2)
    with scratch_allocator():  # the twin makes its tensor descriptors on the device
        grid = (min(sm_count(q.device), n_cs_rows * H),)
        if gluon and specialized:
            gluon_gla_bwd_dg_specialized_kernel[grid](**args, NUM_STAGES=3, num_warps=4,
                                                       maxnreg=DG_SPECIALIZED_MAXNREG)
        elif gluon:
            gluon_gla_bwd_dg_kernel[grid](**args, NUM_STAGES=3, num_warps=8)
        else:
            chunk_simple_gla_bwd_grads_kernel[(n_cs_rows * HV // 4,)](**args, num_warps=8, num_stages=2)
    return dg


CASES = {
    "dense B2 T1000, one query/key head of 16 value heads": dict(B=2, T=1000, H=1, HV=16),
    "dense B1 T640, two query/key heads of 8": dict(B=1, T=640, H=2, HV=16),
    "varlen with a one-token sequence": dict(B=1, T=2100, H=1, HV=16, cu=[0, 1, 1000, 1001, 2100]),
}


@pytest.mark.parametrize("specialized", [False, True], ids=["twin", "warp-specialised"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_twin_gives_the_triton_kernels_dg(case, specialized):
    from recurscan.descriptors import build_chunk_descriptors
    c = CASES[case]
    B, T, H, HV, K, V = c["B"], c["T"], c["H"], c["HV"], 128, 64
    gen = torch.Generator(device=DEV).manual_seed(7)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    q, k = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16()
    v, do = rn(B, T, HV, V).bfloat16(), rn(B, T, HV, V).bfloat16()
    g = -torch.rand(B, T, HV, device=DEV, generator=gen)
    g[:, 300] = float("-inf")  # resets: a new segment
    g[0, 500, 3] = float("-inf")
    g[0, T - 100, 5] = float("nan")  # a bad decay: selected out of the gates, as the twin does
    cu = ci = co = None
    if "cu" in c:
        cu = torch.tensor(c["cu"], device=DEV, dtype=torch.int32)
        d = build_chunk_descriptors(cu, device=DEV)
        ci, co = d.chunk_indices, d.chunk_offsets
        n_cs_rows = ci.shape[0]
    else:
        n_cs_rows = B * ((T + BT - 1) // BT)
    states, dstates = (rn(n_cs_rows, HV, K, V).bfloat16() * 0.1 for _ in range(2))
    want = dg_of(False, q, k, v, g, do, states, dstates, cu, ci, co, n_cs_rows)
    got = dg_of(True, q, k, v, g, do, states, dstates, cu, ci, co, n_cs_rows, specialized)
    torch.cuda.synchronize()
    assert torch.equal(want.isnan(), got.isnan()), \
        f"written rows differ: {int((want.isnan() != got.isnan()).sum())} elements, first at " \
        f"{(want.isnan() != got.isnan()).nonzero()[0].tolist()}"
    ok = ~want.isnan()
    err = relative_rms(got[ok].double(), want[ok].double())
    worst = (got[ok] - want[ok]).abs().argmax()
    assert err < 1e-5, f"relative RMS {err:.2e}; worst {float(got[ok][worst])} against {float(want[ok][worst])}"


@pytest.mark.parametrize("specialized", [False, True], ids=["twin", "warp-specialised"])
@pytest.mark.parametrize("Bt, T", [(2, 1000), (1, 4096)])
def test_ssd_training_with_the_dg_twin_gives_the_triton_kernels_gradients(Bt, T, specialized, monkeypatch):
    """SSD forward + backward (80 value heads of one group; mamba's seq_idx resets at 2 x 1000) with
    the dg launch as its twin (plan.gla.GLUON_GLA_DG on; with ``specialized``, warp-specialised:
    GLUON_GLA_DG_SPECIALIZED) or as the Triton kernel: every gradient within float32 rounding of the
    other's, and the kernel asked for ran."""
    import recurscan
    import recurscan.launch.gla as launch_gla
    from recurscan.plan import gla as plan_gla
    from recurscan.runtime.cache import clear_caches
    picked = []
    choose = launch_gla._dg_twin

    def recording(*a, **kw):
        step = choose(*a, **kw)
        picked.append(getattr(step.kernel, "fn", step.kernel).__name__)
        return step
    monkeypatch.setattr(launch_gla, "_dg_twin", recording)
    gen = torch.Generator(device=DEV).manual_seed(21)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    H, P, N = 80, 64, 128
    x, dt = rn(Bt, T, H, P).bfloat16(), rn(Bt, T, H)
    A, dt_bias, D = -torch.rand(H, device=DEV, generator=gen), rn(H), rn(H)
    B_, C_ = rn(Bt, T, 1, N).bfloat16(), rn(Bt, T, 1, N).bfloat16()
    kw = dict(chunk_size=256, dt_softplus=True)
    if T == 1000:
        seq_idx = torch.zeros(Bt, T, dtype=torch.int32, device=DEV)
        seq_idx[:, 300:] = 1
        kw["seq_idx"] = seq_idx
    dy = rn(Bt, T, H, P).bfloat16()
    out = {}
    monkeypatch.setattr(plan_gla, "GLUON_GLA_DG_SPECIALIZED",
                        dataclasses.replace(plan_gla.GLUON_GLA_DG_SPECIALIZED, on=specialized))
    want = "gluon_gla_bwd_dg_specialized_kernel" if specialized else "gluon_gla_bwd_dg_kernel"
    for twin in (False, True):
        monkeypatch.setattr(plan_gla, "GLUON_GLA_DG", dataclasses.replace(plan_gla.GLUON_GLA_DG, on=twin))
        clear_caches()
        picked.clear()
        leaves = [t.detach().clone().requires_grad_() for t in (x, dt, A, B_, C_, D, dt_bias)]
        y = recurscan.mamba_chunk_scan_combined(*leaves[:5], D=leaves[5], dt_bias=leaves[6], **kw)
        out[twin] = torch.autograd.grad(y, leaves, dy)
        assert picked and picked[-1] == (want if twin else "chunk_simple_gla_bwd_grads_kernel"), picked
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D", "dt_bias"), out[False], out[True]):
        assert torch.isfinite(b).all(), name
        err = relative_rms(b.double(), a.double())
        assert err < 1e-4, f"{name}: relative RMS {err:.2e}"
