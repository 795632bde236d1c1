"""The GLA backward's reverse sweep as its Gluon twin (kernels/gluon/gla_backward_sweep.py) against
the Triton kernel it twins (kernels/gla/backward.py, GATE_SCORES, 64 value columns on 4 warps),
both launched directly on the same synthetic inputs: the group prep's scores and coefficient rows
with calm and stormy chunks mixed, dS' of every chunk, dV and dh0 bit for bit. The end-to-end
tests through SSD's training path are in test_gluon_gla_sweep_gpu.py; these say which output and
which chunk differs when they do not agree. Run: ``python -m pytest -m gpu
tests/gpu/test_gluon_gla_reverse_sweep_gpu.py``."""
import pytest
import torch
import triton.language as tl

from tests.helpers.tolerances import bits

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gluon_only")]

DEV = "cuda"
BT = 64


def group_prep_outputs(B, T, H, HV, cu_seqlens, calm_share, gen):
    """Scores ``[B * T, H, BT]`` (bf16; both kernels read whatever is there) and ``coef [slots, HV,
    BT, 8]`` as the group prep writes them: a chunk is calm for a head with probability
    ``calm_share`` (column factors f = 1 / (lam scale)), else stormy (f NaN in every row; gc
    falling, a reset at a random row)."""
    rows = B * T
    scores = torch.randn(rows, H, BT, device=DEV, generator=gen).bfloat16()
    slots = rows // BT + (cu_seqlens.numel() if cu_seqlens is not None else B) + 1
    coef = torch.zeros(slots, HV, BT, 8, device=DEV)
    u = lambda *s: torch.rand(*s, device=DEV, generator=gen)  # noqa: E731
    lam_s = (0.5 + 0.5 * u(slots, HV, BT)) * 0.125
    coef[..., 1] = lam_s
    coef[..., 2] = u(slots, HV, BT)
    coef[..., 3] = 0.5 + 0.5 * u(slots, HV, BT)
    coef[..., 4] = -torch.cumsum(u(slots, HV, BT), dim=-1)
    reset = (torch.arange(BT, device=DEV) >= torch.randint(1, BT, (slots, HV, 1), device=DEV, generator=gen))
    coef[..., 5] = reset.float()
    calm = u(slots, HV, 1) < calm_share
    coef[..., 0] = torch.where(calm, 1.0 / lam_s, float("nan"))
    coef[..., 4:6] = torch.where(calm[..., None], 0.0, coef[..., 4:6])
    return scores, coef


def run(gluon, q, k, do, scores, coef, dht, h0, cu_seqlens, chunk_offsets, n_cs_rows, T):
    from recurscan.kernels.gla.backward import chunk_simple_gla_bwd_sweep_kernel
    from recurscan.runtime.launcher import scratch_allocator
    B, _, H, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    dstates = torch.full((n_cs_rows, HV, K, V), float("nan"), device=DEV, dtype=q.dtype)
    dv = torch.full(do.shape, float("nan"), device=DEV)
    dh0 = torch.full((N, HV, K, V), float("nan"), device=DEV)
    args = dict(q=q, k=k, g=dv, do=do, dstates=dstates, dht=dv if dht is None else dht, dh0=dh0, dv=dv,
                cu_seqlens=cu_seqlens if cu_seqlens is not None else dv,
                chunk_offsets=chunk_offsets if chunk_offsets is not None else dv, T=T, scale=K ** -0.5,
                n_cs_rows=n_cs_rows, qg=dv, kg=dv, aqk=scores, dl=dv, coef=coef, x=dv, step=dv, D=dv, dx=dv, dstep=dv,
                dD=dv, H=H, HV=HV, K=K, V=V, BT=BT, BK=K,
                BV=64, IS_VARLEN=cu_seqlens is not None, HAS_G=False, HAS_DHT=dht is not None, STORE_DH0=True,
                DOT_PRECISION="tf32", DT=tl.bfloat16, PER_KEY=False, GATE_SCORES=True)
    grid = (N * HV * (V // 64),)
    with scratch_allocator():  # the twin makes its tensor descriptors on the device
        if gluon == "specialized":
            from recurscan.kernels.gluon.gla_backward_sweep_specialized import gluon_gla_bwd_sweep_specialized_kernel
            from recurscan.launch.delta import SPECIALIZED_MAXNREG
            gluon_gla_bwd_sweep_specialized_kernel[grid](**args, NUM_STAGES=2, num_warps=4, maxnreg=SPECIALIZED_MAXNREG)
        elif gluon:
            from recurscan.kernels.gluon.gla_backward_sweep import gluon_gla_bwd_sweep_kernel
            gluon_gla_bwd_sweep_kernel[grid](**args, NUM_STAGES=2, num_warps=4)
        else:
            chunk_simple_gla_bwd_sweep_kernel[grid](**args, num_warps=4)
    return dstates, dv, dh0


CASES = {
    "dense B2 T1000, calm and stormy, dS' in": dict(B=2, T=1000, calm=0.5, dht=True),
    "dense B1 T512, all calm": dict(B=1, T=512, calm=1.0, dht=False),
    "dense B1 T512, all stormy": dict(B=1, T=512, calm=0.0, dht=False),
    "dense B1 T64, one chunk, calm": dict(B=1, T=64, calm=1.0, dht=True),
    "varlen with a one-token sequence": dict(B=1, T=2100, calm=0.5, dht=False, cu=[0, 1, 1000, 1001, 2100]),
}


@pytest.mark.parametrize("form", ["twin", "specialized"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_twin_gives_the_triton_kernels_bits(case, form):
    """The twin, and its warp-specialised form (kernels/gluon/gla_backward_sweep_specialized.py),
    against the Triton kernel."""
    from recurscan.descriptors import build_chunk_descriptors
    c = CASES[case]
    B, T, H, HV, K, V = c["B"], c["T"], 1, 8, 128, 64
    gen = torch.Generator(device=DEV).manual_seed(3)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=gen)  # noqa: E731
    q, k = rn(B, T, H, K).bfloat16(), rn(B, T, H, K).bfloat16()
    do = rn(B, T, HV, V).bfloat16()
    cu = chunk_offsets = None
    if "cu" in c:
        cu = torch.tensor(c["cu"], device=DEV, dtype=torch.int32)
        desc = build_chunk_descriptors(cu, device=DEV)
        chunk_offsets, n_cs_rows = desc.chunk_offsets, desc.chunk_indices.shape[0]
    else:
        n_cs_rows = B * ((T + BT - 1) // BT)
    N = B if cu is None else cu.numel() - 1
    dht = rn(N, HV, K, V) * 0.1 if c["dht"] else None
    scores, coef = group_prep_outputs(B, T, H, HV, cu, c["calm"], gen)
    want = run(False, q, k, do, scores, coef, dht, None, cu, chunk_offsets, n_cs_rows, T)
    got = run("specialized" if form == "specialized" else True, q, k, do, scores, coef, dht, None, cu, chunk_offsets,
              n_cs_rows, T)
    torch.cuda.synchronize()
    report = []
    for name, a, b in zip(("dstates", "dv", "dh0"), want, got):
        same = bits(a) == bits(b)
        if not bool(same.all()):
            diff = (a.float() - b.float()).abs()
            where = (~same).nonzero()
            report.append(f"{name}: {int((~same).sum())} of {a.numel()} differ, max |diff| {float(diff.nan_to_num(0).max()):.3g}"
                          f" (ref max {float(a.float().abs().nan_to_num(0).max()):.3g}), first at {where[0].tolist()},"
                          f" last at {where[-1].tolist()}")
    assert not report, "\n".join(report)
