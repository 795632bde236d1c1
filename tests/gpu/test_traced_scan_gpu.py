"""The traced scan ops (recurscan/ops/scan.py, issue 22) on the GPU: torch.export of a GDN layer
and of a Mamba2 mixer on CUDA tensors gives one scan node and the eager outputs;
torch.compile(fullgraph=True) runs their forward and backward (the Triton kernels inside the
custom ops, the backward op recomputing under autograd on its own thread) and matches eager."""
import pytest
import torch
from torch.export import Dim, export

from tests.helpers.tolerances import relative_rms
from tests.helpers.layers import GdnLayer, GlaLayer, Mamba2Mixer, scan_nodes

pytestmark = pytest.mark.gpu

MODELS = {"gdn": (lambda: GdnLayer(dim=256, heads=4, head_dim=128), "delta_rule_scan", "x"),
          "mamba2": (lambda: Mamba2Mixer(dim=256, heads=8, head_dim=64, state=128), "ssd_scan", "u"),
          "gla": (lambda: GlaLayer(dim=256, heads=4, head_dim=128), "gla_scan", "x")}


@pytest.mark.parametrize("name", list(MODELS))
def test_export_on_cuda(name):
    make, op, arg = MODELS[name]
    torch.manual_seed(0)
    model = make().cuda()
    x = torch.randn(2, 1024, 256, device="cuda")
    ep = export(model, (x,), dynamic_shapes={arg: {1: Dim("L", min=2, max=1 << 20)}})
    assert len(scan_nodes(ep.graph, op)) == 1
    other = torch.randn(2, 3000, 256, device="cuda")
    with torch.no_grad():
        assert relative_rms(ep.module()(other).double(), model(other).double()) < 1e-5


@pytest.mark.parametrize("name", list(MODELS))
def test_compile_forward_and_backward_on_cuda(name):
    make, _, _ = MODELS[name]
    torch.manual_seed(1)
    model = make().cuda().bfloat16()
    x = torch.randn(2, 2048, 256, device="cuda").bfloat16()
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for run in (compiled, model):
        model.zero_grad()
        xi = x.clone().requires_grad_()
        y = run(xi)
        y.float().square().mean().backward()
        results.append([y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.isfinite(a).all()
        assert relative_rms(a.double(), b.double()) < 2e-2
