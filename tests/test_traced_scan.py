"""The scan as one traced equation (recurscan/ops/scan.py, issue 22) on the CPU: a GDN layer's, a
Mamba2 mixer's and a GLA layer's prefill exported with a dynamic sequence length give one scan node and the same
graph at every length, and their outputs equal eager; ``torch.compile(fullgraph=True)`` runs them
forward and backward with no graph break and matches eager; the packed result's two row ranges
are views of it; the custom ops pass ``torch.library.opcheck``."""
import pytest
import torch
from torch.export import Dim, export

import recurscan
from recurscan.ops.scan import ScanLayout, delta_layout, unpack_delta
from tests.helpers.layers import GdnLayer, GlaLayer, Mamba2Mixer, scan_nodes


LAYERS = {"gdn": (GdnLayer, "delta_rule_scan", "x"), "mamba2": (Mamba2Mixer, "ssd_scan", "u"),
          "gla": (GlaLayer, "gla_scan", "x")}


@pytest.mark.parametrize("layer", list(LAYERS))
def test_export_gives_one_scan_node_at_every_length(layer):
    """torch.export with a dynamic sequence length, at L = 64 and L = 65536: the same graph, one
    scan node and nothing unrolled; the exported program's outputs equal eager at L = 64 and 300
    (and at a length it was not exported at)."""
    torch.manual_seed(0)
    cls, op, arg = LAYERS[layer]
    model = cls().eval()
    graphs = []
    for L in (64, 65536):
        x = torch.randn(2, L, 32)
        ep = export(model, (x,), dynamic_shapes={arg: {1: Dim("L", min=2, max=1 << 20)}})
        assert len(scan_nodes(ep.graph, op)) == 1
        graphs.append([str(n.target) for n in ep.graph.nodes])
    assert graphs[0] == graphs[1]
    run = ep.module()
    for L in (64, 300):
        x = torch.randn(2, L, 32)
        with torch.no_grad():
            assert torch.equal(run(x), model(x))


@pytest.mark.parametrize("layer", ["gdn", "gdp varlen", "mamba2", "gla", "gla per key"])
def test_compile_fullgraph_forward_and_backward_match_eager(layer):
    """torch.compile(fullgraph=True) (inductor): no graph break, the outputs and every parameter's
    and the input's gradient equal eager's to float32 rounding; one scan node forward and one
    backward node."""
    torch.manual_seed(1)
    if layer == "mamba2":
        model, args = Mamba2Mixer(), (torch.randn(2, 130, 32),)
    elif layer.startswith("gla"):
        model, args = GlaLayer(per_key=layer.endswith("key")), (torch.randn(2, 130, 32),)
    elif layer == "gdn":
        model, args = GdnLayer(), (torch.randn(2, 130, 32),)
    else:
        model, args = GdnLayer(num_householder=2), (torch.randn(1, 130, 32), torch.tensor([0, 1, 70, 130]))
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for run in (compiled, model):
        model.zero_grad()
        x = args[0].clone().requires_grad_()
        y = run(x, *args[1:])
        y.square().sum().backward()
        results.append([y.detach(), x.grad] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("layer", ["gdn", "mamba2", "gla"])
def test_the_backward_ops_run_the_triton_path_under_autograd(layer, monkeypatch):
    """The ops' implementations on the Triton path (under the interpreter here; on CUDA the
    planner's): the backward custom op recomputes the forward under autograd on a thread of its
    own (a custom op runs below autograd's dispatch key) and differentiates the Triton path (its
    autograd.Function, or the delta rule's backward stages): compiled (aot_eager) forward and
    backward against the eager PyTorch form, to float32 rounding of the chunked kernels."""
    import recurscan.ops.scan as scan
    torch.manual_seed(4)
    model = {"gdn": GdnLayer, "mamba2": Mamba2Mixer, "gla": GlaLayer}[layer]()
    x = torch.randn(1, 100, 32)
    results = []
    for backend, run in (("triton", torch.compile(model, fullgraph=True, backend="aot_eager")), (None, model)):
        monkeypatch.setattr(scan, "BACKEND", backend)
        model.zero_grad()
        xi = x.clone().requires_grad_()
        y = run(xi)
        y.square().sum().backward()
        results.append([y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=2e-3, atol=2e-4), (a - b).abs().max()


def test_the_packed_result_and_its_views():
    """delta_rule_scan's packed result [1, HV, B*T + N*K, V]: y and the final states are views of
    it (no copy), equal to the eager op's outputs; varlen lays out the N states in order."""
    torch.manual_seed(2)
    B, T, H, HV, K, V = 1, 100, 1, 2, 8, 4
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, g, beta = torch.randn(B, T, HV, V), -torch.rand(B, T, HV), torch.rand(B, T, HV)
    cu = torch.tensor([0, 1, 64, 100])
    packed = torch.ops.recurscan.delta_rule_scan(q, k, v, g, beta, 1, K ** -0.5, None, True, cu, None, None, None,
                                                 False)
    layout = delta_layout(q, v, 3)
    assert layout == ScanLayout(heads=HV, rows_y=T, rows_state=3 * K, width=V) and packed.shape == layout.shape
    y, state = unpack_delta(packed, layout, B, K)
    assert y.data_ptr() == packed.data_ptr() and state.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    o, final = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                                cu_seqlens=cu)
    assert torch.equal(y, o) and torch.equal(state, final)
    assert torch.equal(packed[0, 1, T + 2 * K:T + 3 * K], final[2, 1])  # sequence 2's state, head 1: its K rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_packed_result_holds_the_float32_state_bit_for_bit(dtype):
    """packed_16bit: the result in q's dtype, [1, HV, B*T + 2*N*K, V]; y is the eager output (same
    dtype, no cast), and each float32 state row's bits are two consecutive 16-bit rows, which the
    layout views as the float32 state (equal to the eager final state); traced without a gradient,
    the public op takes this form, and a traced call that needs a gradient keeps float32."""
    torch.manual_seed(4)
    B, T, H, HV, K, V = 1, 100, 1, 2, 8, 4
    q, k = torch.randn(B, T, H, K).to(dtype), torch.randn(B, T, H, K).to(dtype)
    v, g, beta = torch.randn(B, T, HV, V).to(dtype), -torch.rand(B, T, HV), torch.rand(B, T, HV).to(dtype)
    cu = torch.tensor([0, 1, 64, 100])
    packed = torch.ops.recurscan.delta_rule_scan(q, k, v, g, beta, 1, K ** -0.5, None, True, cu, None, None, None,
                                                 True)
    layout = delta_layout(q, v, 3, packed_16bit=True)
    assert layout.rows_state == 2 * 3 * K and packed.shape == layout.shape and packed.dtype == dtype
    y, state = unpack_delta(packed, layout, B, K)
    assert y.dtype == dtype and state.dtype == torch.float32 and state.shape == (3, HV, K, V)
    o, final = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                                cu_seqlens=cu)
    assert torch.equal(y, o) and torch.equal(state, final)
    rows = packed[0, 1, T + 2 * 2 * K:T + 2 * 3 * K].reshape(K, 2 * V)  # sequence 2, head 1: 2K rows
    assert torch.equal(rows.view(torch.float32), final[2, 1])
    from recurscan.ops.scan import packs_16bit
    assert packs_16bit(q, V, k, v) and not packs_16bit(q.float(), V) and not packs_16bit(q, 5)
    assert not packs_16bit(q, V, v.clone().requires_grad_())
    with torch.no_grad():
        assert packs_16bit(q, V, v.clone().requires_grad_())


@pytest.mark.parametrize("op", ["delta_rule_scan", "ssd_scan", "gla_scan"])
def test_the_custom_ops_pass_opcheck(op):
    """torch.library.opcheck: the fake implementation's shapes, strides and dtypes are the real
    one's, the schema is right, and autograd is registered (float64 inputs)."""
    torch.manual_seed(3)
    d = dict(dtype=torch.float64)
    if op == "delta_rule_scan":
        args = (torch.randn(1, 70, 1, 8, **d), torch.randn(1, 70, 1, 8, **d), torch.randn(1, 70, 2, 4, **d),
                -torch.rand(1, 70, 2, **d), torch.rand(1, 70, 2, **d), 1, 0.5, torch.randn(2, 2, 8, 4, **d), True,
                torch.tensor([0, 30, 70]), None, None, None, False)
    elif op == "gla_scan":
        args = (torch.randn(1, 70, 1, 8, **d), torch.randn(1, 70, 1, 8, **d), torch.randn(1, 70, 2, 4, **d),
                -torch.rand(1, 70, 2, 8, **d), True, 0.5, torch.randn(2, 2, 8, 4, **d), None, torch.tensor([0, 30, 70]),
                None, None, False)
    else:
        args = (torch.randn(2, 70, 2, 4, **d), torch.randn(2, 70, 2, **d), -torch.rand(2, **d),
                torch.randn(2, 70, 1, 8, **d), torch.randn(2, 70, 1, 8, **d), 64, torch.randn(2, **d),
                torch.randn(2, 70, 2, 4, **d), torch.randn(2, **d), torch.randn(2, 2, 4, 8, **d), None, None, True, 0.0,
                float("inf"), False)
    args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    torch.library.opcheck(getattr(torch.ops.recurscan, op).default, args)


class _VarlenGdn(torch.nn.Module):
    def forward(self, q, k, v, g, beta, cu_seqlens):
        return recurscan.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True,
                                                output_final_state=True)


class _DenseGdp(torch.nn.Module):
    def forward(self, q, k, v, g, beta):
        return recurscan.chunk_gated_delta_product(q, k, v, g, beta, 2, use_qk_l2norm_in_kernel=True,
                                                   output_final_state=True)


def test_export_of_varlen_and_of_dense_gdp_calls():
    """Varlen GDN with a dynamic token count and a dynamic number of sequences (N >= 2: one
    sequence is the dense route), and fla's dense chunk_gated_delta_product (its boundaries made
    from the shape on the device while traced): one scan node, outputs and final states equal to
    eager at other sizes than the example's."""
    torch.manual_seed(5)
    H, K = 2, 8
    rn = torch.randn
    L, N1 = Dim("L", min=2, max=1 << 20), Dim("N1", min=3, max=4096)
    example = (rn(1, 100, H, K), rn(1, 100, H, K), rn(1, 100, H, K), -torch.rand(1, 100, H), torch.rand(1, 100, H),
               torch.tensor([0, 30, 100]))
    ep = export(_VarlenGdn(), example, dynamic_shapes=({1: L}, {1: L}, {1: L}, {1: L}, {1: L}, {0: N1}))
    assert len(scan_nodes(ep.graph, "delta_rule_scan")) == 1
    other = (rn(1, 300, H, K), rn(1, 300, H, K), rn(1, 300, H, K), -torch.rand(1, 300, H), torch.rand(1, 300, H),
             torch.tensor([0, 1, 64, 200, 300]))
    for a, b in zip(ep.module()(*other), _VarlenGdn()(*other)):
        assert torch.equal(a, b)
    gdp = (rn(2, 100, H, K), rn(2, 200, H, K), rn(2, 200, H, K), -torch.rand(2, 100, H), torch.rand(2, 200, H))
    ep = export(_DenseGdp(), gdp, dynamic_shapes=({1: L}, {1: 2 * L}, {1: 2 * L}, {1: L}, {1: 2 * L}))
    assert len(scan_nodes(ep.graph, "delta_rule_scan")) == 1
    other = (rn(2, 70, H, K), rn(2, 140, H, K), rn(2, 140, H, K), -torch.rand(2, 70, H), torch.rand(2, 140, H))
    for a, b in zip(ep.module()(*other), _DenseGdp()(*other)):
        assert torch.equal(a, b)


def test_record_schedules_gives_each_planned_call_as_printable_data():
    """recurscan.record_schedules: the family, problem and schedule of each call signature planned
    inside the block (the caches cleared on entry, so a signature planned before is planned
    again), printable; the blocks do not nest."""
    q, k, v = torch.randn(1, 100, 2, 16), torch.randn(1, 100, 2, 16), torch.randn(1, 100, 2, 16)
    g, beta = -torch.rand(1, 100, 2), torch.rand(1, 100, 2)
    recurscan.chunk_gated_delta_rule(q, k, v, g, beta)
    with recurscan.record_schedules() as log:
        recurscan.chunk_gated_delta_rule(q, k, v, g, beta)
        recurscan.chunk_simple_gla(q, k, v, g)
        with pytest.raises(RuntimeError, match="already recording"):
            with recurscan.record_schedules():
                pass
    assert [(r.family, r.schedule.algorithm, r.problem.tokens) for r in log] == [("delta_rule", "chunked", 100),
                                                                                 ("gla", "chunked", 100)]
    assert str(log[0]).startswith("delta_rule (batch 1, tokens 100, heads 2") and "on torch" in str(log[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_path_writes_the_packed_result_in_place(dtype, monkeypatch):
    """On the Triton path (the interpreter here) delta_rule_scan's kernels write y and the final
    state straight into the packed result (its views are the launches' o and final buffers), and
    the result equals the eager Triton op's outputs bit for bit: float32 inputs (a float32 packed
    result), and bf16 with packed_16bit."""
    import recurscan.launch.delta as launch_delta
    import recurscan.ops.scan as scan
    monkeypatch.setattr(scan, "BACKEND", "triton")
    torch.manual_seed(5)
    B, T, H, HV, K, V = 2, 70, 1, 2, 16, 16
    q, k = torch.randn(B, T, H, K).to(dtype), torch.randn(B, T, H, K).to(dtype)
    v, g, beta = torch.randn(B, T, HV, V).to(dtype), -torch.rand(B, T, HV), torch.rand(B, T, HV).to(dtype)
    given = []
    run = launch_delta.run_delta_launches
    monkeypatch.setattr(launch_delta, "run_delta_launches", lambda *a: given.append(a[2]) or run(*a))
    sixteen = dtype == torch.bfloat16
    packed = torch.ops.recurscan.delta_rule_scan(q, k, v, g, beta, 1, K ** -0.5, None, True, None, None, None, None,
                                                 sixteen)
    y, state = unpack_delta(packed, delta_layout(q, v, B, sixteen), B, K)
    assert given and given[0]["o"].data_ptr() == packed.data_ptr(), "the kernels did not write the packed result"
    assert given[0]["final"].untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    o, final = recurscan.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                                backend="triton")
    assert torch.equal(y, o) and torch.equal(state, final)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["ssd", "gla"])
def test_ssd_and_gla_write_the_packed_result_in_place_too(family, dtype, monkeypatch):
    """ssd_scan and gla_scan on the Triton path (the interpreter here): the delta sweep's o and
    final buffers are the packed result's views (SSD's states in the kernel's [Nstate, P] rows), and
    y and the final states equal the eager Triton op's bit for bit."""
    import recurscan.launch.delta as launch_delta
    import recurscan.launch.gla as launch_gla
    import recurscan.ops.scan as scan
    from recurscan.ops.scan import ssd_layout, unpack_ssd
    monkeypatch.setattr(scan, "BACKEND", "triton")
    torch.manual_seed(6)
    given = []
    run = launch_delta.run_delta_launches
    monkeypatch.setattr(launch_gla, "run_delta_launches", lambda *a: given.append(a[2]) or run(*a))
    sixteen = dtype == torch.bfloat16
    Bt, T, H, W, N = 2, 70, 2, 16, 16
    if family == "ssd":
        x, z = torch.randn(Bt, T, H, W).to(dtype), torch.randn(Bt, T, H, W).to(dtype)
        dt, A, D, dt_bias = torch.randn(Bt, T, H), -torch.rand(H), torch.randn(H), torch.randn(H)
        B, C = torch.randn(Bt, T, 1, N).to(dtype), torch.randn(Bt, T, 1, N).to(dtype)
        packed = torch.ops.recurscan.ssd_scan(x, dt, A, B, C, 64, D, z, dt_bias, None, None, None, True, 0.0,
                                              float("inf"), sixteen)
        y, final = unpack_ssd(packed, ssd_layout(x, B, Bt, sixteen), Bt, N)
        want = recurscan.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=64, D=D, z=z, dt_bias=dt_bias,
                                                   dt_softplus=True, return_final_states=True, backend="triton")
    else:
        q, k, v = (torch.randn(Bt, T, H, W).to(dtype) for _ in range(3))
        g = -torch.rand(Bt, T, H)
        packed = torch.ops.recurscan.gla_scan(q, k, v, g, False, W ** -0.5, None, None, None, None, None, sixteen)
        y, final = unpack_delta(packed, delta_layout(q, v, Bt, sixteen), Bt, W)
        want = recurscan.chunk_simple_gla(q, k, v, g, output_final_state=True, backend="triton")
    assert given and given[0]["o"].data_ptr() == packed.data_ptr(), "the sweep did not write the packed result"
    assert given[0]["final"].untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    assert torch.equal(y, want[0]) and torch.equal(final, want[1])
