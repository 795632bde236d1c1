"""The scan as one traced equation (issue 22): ``torch.library`` custom ops whose one
result is a packed tensor ``[1, H, L + S, W]``, so that ``torch.export`` and ``torch.compile`` see
a prefill as a single node of constant size at every prompt length.

Layout (:class:`ScanLayout`): H is the value heads (HV); W is the value width V; rows ``[0, L)``
are the output y, one row per token of the flattened batch (``L = B * T``; varlen: the token
stream), and rows ``[L, L + S)`` are the carried state, ``S = N * K``: sequence n's ``[K, V]``
state is rows ``L + n K .. L + (n + 1) K``. The packed tensor is float32 (float64 for float64
inputs) so that the state keeps its precision, and y is cast back to q's dtype by the public op;
or, for 16-bit inputs traced without a gradient (``packed_16bit``), in q's dtype with each float32
state row's bits in two consecutive rows (``S = 2 N K``; :meth:`ScanLayout.state` views them as
float32), so that y needs no cast. The forwards on the delta sweep (the delta rule, SSD, GLA) write
y and the state in place through the views (:func:`_packed`); the others' results are copied in.
Autograd does not pass through a dtype view, so a traced call with a gradient keeps the float32
form.

The forward is the op's own (the oracle on CPU tensors, the Triton kernels on CUDA); the
backward is a second custom op that recomputes the forward under autograd and differentiates it
(the oracle's autograd on the CPU, the Triton backward on CUDA; :func:`grads_by_autograd`), so
the traced backward is one node too. The public ops take this path while they are being traced
(``torch.compiler.is_compiling()``); eager calls keep their direct path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

#: The backend the ops' implementations ask for (None: the planner's); the tests set "triton" to
#: run the Triton path on CPU tensors under the interpreter.
BACKEND = None


@dataclass(frozen=True)
class ScanLayout:
    """The two row ranges of a packed scan result ``[1, heads, rows_y + rows_state, width]``.

    Example (GDN over two sequences of a varlen batch of 100 tokens, K = 8, V = 4, two value heads):
        >>> import torch, recurscan
        >>> from recurscan.ops.scan import delta_layout, unpack_delta
        >>> q, k, v = torch.randn(1, 100, 1, 8), torch.randn(1, 100, 1, 8), torch.randn(1, 100, 2, 4)
        >>> g, beta, cu = -torch.rand(1, 100, 2), torch.rand(1, 100, 2), torch.tensor([0, 40, 100])
        >>> packed = torch.ops.recurscan.delta_rule_scan(q, k, v, g, beta, 1, 8 ** -0.5, None, True, cu,
        ...                                              None, None, None, False)
        >>> layout = delta_layout(q, v, sequences=2)
        >>> layout, packed.shape
        (ScanLayout(heads=2, rows_y=100, rows_state=16, width=4, state_words=1), torch.Size([1, 2, 116, 4]))
        >>> y, state = unpack_delta(packed, layout, batch=1, key_dim=8)
        >>> y.shape, state.shape   # views of packed: [B, T, HV, V] and [N, HV, K, V]
        (torch.Size([1, 100, 2, 4]), torch.Size([2, 2, 8, 4]))
    """

    heads: int
    rows_y: int  # L: one per token
    rows_state: int  # S: N sequences x K state rows (x 2 with state_words 2)
    width: int  # W: the value width
    state_words: int = 1  # packed rows a state row takes: 2 when 16-bit rows hold a float32 state's bits

    @property
    def shape(self) -> tuple:
        return (1, self.heads, self.rows_y + self.rows_state, self.width)

    def y(self, packed: torch.Tensor) -> torch.Tensor:
        """``[H, L, W]``: the output rows (a view)."""
        return packed[0, :, :self.rows_y]

    def state(self, packed: torch.Tensor) -> torch.Tensor:
        """``[H, S / state_words, W]``: the carried-state rows (a view; float32 over pairs of 16-bit
        rows when ``state_words`` is 2)."""
        rows = packed[0, :, self.rows_y:]
        if self.state_words == 2:
            rows = rows.reshape(self.heads, self.rows_state // 2, 2 * self.width).view(torch.float32)
        return rows


def delta_layout(q: torch.Tensor, v: torch.Tensor, sequences: int, packed_16bit: bool = False) -> ScanLayout:
    """The layout of a delta-rule scan of q ``[B, T, H, K]``, v ``[B, T*M, HV, V]`` over
    ``sequences`` sequences (``packed_16bit``: the state's bits in pairs of 16-bit rows)."""
    B, T, _, K = q.shape
    words = 2 if packed_16bit else 1
    return ScanLayout(heads=v.shape[2], rows_y=B * T, rows_state=sequences * K * words, width=v.shape[3],
                      state_words=words)


def packed_dtype(q: torch.Tensor, packed_16bit: bool = False) -> torch.dtype:
    if packed_16bit:
        return q.dtype
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def packs_16bit(x: torch.Tensor, width: int, *inputs) -> bool:
    """Whether a traced scan of 16-bit ``x`` packs its result in x's dtype: an even value width
    (a float32 state row is two 16-bit rows) and no input that autograd follows (the state's
    float32 view would drop its gradient)."""
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x,) + inputs)
    return x.dtype in (torch.bfloat16, torch.float16) and width % 2 == 0 and not grad


def unpack_delta(packed: torch.Tensor, layout: ScanLayout, batch: int, key_dim: int):
    """``(y [B, T, HV, V], state [N, HV, K, V])`` of a packed delta-rule result, as views."""
    L = layout.rows_y
    y = layout.y(packed).unflatten(1, (batch, L // batch)).permute(1, 2, 0, 3)
    sequences = layout.rows_state // layout.state_words // key_dim
    state = layout.state(packed).unflatten(1, (sequences, key_dim)).permute(1, 0, 2, 3)
    return y, state


def _packed(layout: ScanLayout, like: torch.Tensor, forward, unpack) -> torch.Tensor:
    """A new packed result of ``layout`` (in :func:`packed_dtype` of ``like``) holding the ``(y,
    state)`` of ``forward(out)``, where ``out`` is the pair of views ``unpack(packed)`` gives when
    they are in ``like``'s dtype (a forward may write them in place; what it returns elsewhere is
    copied into them)."""
    packed = like.new_empty(layout.shape, dtype=packed_dtype(like, layout.state_words == 2))
    y_view, state_view = unpack(packed)
    with torch.no_grad():
        y, state = forward((y_view, state_view) if packed.dtype == like.dtype else None)
    for got, view in ((y, y_view), (state, state_view)):
        if (got.data_ptr(), got.stride(), got.dtype) != (view.data_ptr(), view.stride(), view.dtype):
            view.copy_(got)
    return packed


def _sequences(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _delta_forward(q, k, v, g, beta, num_householder, scale, initial_state, use_qk_l2norm, cu_seqlens,
                   chunk_indices, chunk_offsets, chunk_indices_dp, out=None):
    from .delta_rule import _run_delta
    return _run_delta(q, k, v, g, beta, num_householder=num_householder, scale=scale, initial_state=initial_state,
                      output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=cu_seqlens,
                      state=None, state_indices=None, return_chunk_states=False, chunk_indices=chunk_indices,
                      chunk_offsets=chunk_offsets, chunk_indices_dp=chunk_indices_dp, backend=BACKEND, out=out)


def grads_by_autograd(forward, inputs, cotangents) -> list:
    """The gradients of ``forward(*inputs)`` (a tuple of tensors) for ``cotangents``, one per input
    (None where an input is None or unused), by autograd on the calling thread. A custom op's
    implementation runs with autograd's dispatch keys excluded (a thread-local state), so they are
    let back in for the forward and its differentiation here. (``torch.func.vjp`` would record a
    graph too, but wraps the tensors, and the Triton path's signature caches read data pointers.
    Another thread would record one, but a CUDA backward's ops then queue for the autograd engine's
    device thread, which is the one waiting here: a deadlock, seen on the H200 at 59ed760.)"""
    autograd = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality) | \
        torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                         torch._C._dispatch_tls_local_exclude_set() - autograd), torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
        outputs = forward(*leaves)
        wrt = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(outputs, wrt, cotangents, allow_unused=True))
        return [None if t is None else next(grads) for t in leaves]


#: The forward ops take their inputs in whatever layout the compiler has them (every op reads
#: strided tensors): inductor's default, exact strides, copied Mamba2's split projections into new
#: buffers before the scan (gpu_traced_replay_mixer_5e37baa.json).
FLEXIBLE = (torch.Tag.flexible_layout,)


@torch.library.custom_op("recurscan::delta_rule_scan", mutates_args=(), tags=FLEXIBLE)
def delta_rule_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                    beta: Optional[torch.Tensor], num_householder: int, scale: float,
                    initial_state: Optional[torch.Tensor], use_qk_l2norm: bool, cu_seqlens: Optional[torch.Tensor],
                    chunk_indices: Optional[torch.Tensor], chunk_offsets: Optional[torch.Tensor],
                    chunk_indices_dp: Optional[torch.Tensor], packed_16bit: bool) -> torch.Tensor:
    """The delta-rule scan (GDN: ``num_householder`` 1; GDP: M > 1) with its packed result
    ``[1, HV, B*T + N*K, V]`` (:class:`ScanLayout`; ``packed_16bit``: in q's 16-bit dtype,
    ``[1, HV, B*T + 2*N*K, V]``). Arguments as ``chunk_gated_delta_product_varlen`` (q ``[B, T, H,
    K]``, k, v, beta on the expanded stream ``[B, T*M, ...]``, g ``[B, T, HV]``); ``scale`` a
    float (the public ops resolve its default). The Triton path writes y and the state in place."""
    layout = delta_layout(q, v, _sequences(q, cu_seqlens), packed_16bit)
    return _packed(layout, q, lambda out: _delta_forward(q, k, v, g, beta, num_householder, scale, initial_state,
                                                         use_qk_l2norm, cu_seqlens, chunk_indices, chunk_offsets,
                                                         chunk_indices_dp, out),
                   lambda p: unpack_delta(p, layout, q.shape[0], q.shape[3]))


@delta_rule_scan.register_fake
def _(q, k, v, g, beta, num_householder, scale, initial_state, use_qk_l2norm, cu_seqlens, chunk_indices,
      chunk_offsets, chunk_indices_dp, packed_16bit):
    return q.new_empty(delta_layout(q, v, _sequences(q, cu_seqlens), packed_16bit).shape,
                       dtype=packed_dtype(q, packed_16bit))


@torch.library.custom_op("recurscan::delta_rule_scan_backward", mutates_args=())
def delta_rule_scan_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: Optional[torch.Tensor], beta: Optional[torch.Tensor], num_householder: int,
                             scale: float, initial_state: Optional[torch.Tensor], use_qk_l2norm: bool,
                             cu_seqlens: Optional[torch.Tensor], chunk_indices: Optional[torch.Tensor],
                             chunk_offsets: Optional[torch.Tensor], chunk_indices_dp: Optional[torch.Tensor]
                             ) -> list[torch.Tensor]:
    """The gradients ``[dq, dk, dv, dg, dbeta, dinitial_state]`` of :func:`delta_rule_scan` for the
    gradient ``grad`` of its packed result (an absent input's entry is an empty tensor): the
    forward again under autograd, differentiated (the oracle on CPU tensors, the Triton backward
    on CUDA)."""
    layout = delta_layout(q, v, _sequences(q, cu_seqlens))
    do, dht = unpack_delta(grad, layout, q.shape[0], q.shape[3])
    inputs = (q, k, v, g, beta, initial_state)
    grads = grads_by_autograd(
        lambda q_, k_, v_, g_, beta_, h0_: _delta_forward(q_, k_, v_, g_, beta_, num_householder, scale, h0_,
                                                          use_qk_l2norm, cu_seqlens, chunk_indices, chunk_offsets,
                                                          chunk_indices_dp),
        inputs, (do.to(q.dtype), dht))
    return [q.new_empty(0) if t is None else (torch.zeros_like(t) if d is None else d.to(t.dtype)).contiguous()
            for t, d in zip(inputs, grads)]


@delta_rule_scan_backward.register_fake
def _(grad, q, k, v, g, beta, num_householder, scale, initial_state, use_qk_l2norm, cu_seqlens, chunk_indices,
      chunk_offsets, chunk_indices_dp):
    return [q.new_empty(0) if t is None else t.new_empty(t.shape) for t in (q, k, v, g, beta, initial_state)]


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, M, scale, h0, l2, cu, ci, co, cidp, packed_16bit) = inputs
    ctx.save_for_backward(q, k, v, g, beta, h0, cu, ci, co, cidp)
    ctx.options = (M, scale, l2, packed_16bit)


def _refuse_16bit_backward(packed_16bit: bool) -> None:
    if packed_16bit:
        raise RuntimeError("recurscan's traced scan was traced without a gradient (its packed result in 16 bits, "
                           "the state as a float32 view, which autograd does not follow); trace it with the "
                           "inputs that need gradients requiring grad")


def _backward(ctx, grad):
    q, k, v, g, beta, h0, cu, ci, co, cidp = ctx.saved_tensors
    M, scale, l2, packed_16bit = ctx.options
    _refuse_16bit_backward(packed_16bit)
    dq, dk, dv, dg, dbeta, dh0 = torch.ops.recurscan.delta_rule_scan_backward(grad, q, k, v, g, beta, M, scale, h0,
                                                                               l2, cu, ci, co, cidp)
    absent = lambda t, d: None if t is None else d  # noqa: E731
    return (dq, dk, dv, absent(g, dg), absent(beta, dbeta), None, None, absent(h0, dh0), None, None, None, None, None,
            None)


torch.library.register_autograd("recurscan::delta_rule_scan", _backward, setup_context=_setup_context)


def traced_delta(q, k, v, g, beta, *, num_householder, scale, initial_state, output_final_state,
                 use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, chunk_indices_dp):
    """What a public delta-rule op returns while it is being traced: one ``delta_rule_scan`` node,
    its packed result unpacked into views (y cast to q's dtype)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    packed_16bit = packs_16bit(q, v.shape[3], k, v, g, beta, initial_state)
    packed = torch.ops.recurscan.delta_rule_scan(q, k, v, g, beta, num_householder, scale, initial_state,
                                                 bool(use_qk_l2norm_in_kernel), cu_seqlens, chunk_indices,
                                                 chunk_offsets, chunk_indices_dp, packed_16bit)
    layout = delta_layout(q, v, _sequences(q, cu_seqlens), packed_16bit)
    y, state = unpack_delta(packed, layout, q.shape[0], q.shape[3])
    return y.to(q.dtype), (state if output_final_state else None)


def ssd_layout(x: torch.Tensor, B: torch.Tensor, sequences: int, packed_16bit: bool = False) -> ScanLayout:
    """The layout of a Mamba2 SSD scan of x ``[Bt, T, H, P]`` with B ``[Bt, T, G, Nstate]``: the
    state of each sequence is Nstate rows of width P (the kernels' ``[K, V]``; mamba's ``[H, P,
    Nstate]`` is its transpose); ``packed_16bit`` as :func:`delta_layout`."""
    Bt, T, H, P = x.shape
    words = 2 if packed_16bit else 1
    return ScanLayout(heads=H, rows_y=Bt * T, rows_state=sequences * B.shape[3] * words, width=P, state_words=words)


def unpack_ssd(packed: torch.Tensor, layout: ScanLayout, batch: int, state_dim: int):
    """``(y [Bt, T, H, P], final states [N, H, P, Nstate])`` of a packed SSD result, as views."""
    y, state = unpack_delta(packed, layout, batch, state_dim)
    return y, state.transpose(-1, -2)


def _ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                 dt_min, dt_max, out=None):
    """``(y, final states [N, H, P, Nstate])``; ``out``: the packed result's views (y, and the
    states in the kernel's ``[N, H, Nstate, P]``), which the Triton forward writes in place."""
    from .ssd import _run_ssd
    y, final = _run_ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                        (dt_min, dt_max), None, None, None, None, False, BACKEND,
                        out=None if out is None else (out[0], out[1].transpose(-1, -2)))
    return y, final


@torch.library.custom_op("recurscan::ssd_scan", mutates_args=(), tags=FLEXIBLE)
def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
             D: Optional[torch.Tensor], z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
             initial_states: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
             cu_seqlens: Optional[torch.Tensor], dt_softplus: bool, dt_min: float, dt_max: float,
             packed_16bit: bool) -> torch.Tensor:
    """Mamba2 SSD (``mamba_chunk_scan_combined``'s arguments) with its packed result
    ``[1, H, Bt*T + N*Nstate, P]`` (:func:`ssd_layout`; ``packed_16bit`` as :func:`delta_rule_scan`)."""
    layout = ssd_layout(x, B, _sequences(x, cu_seqlens), packed_16bit)
    return _packed(layout, x, lambda out: _ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                                       seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max, out),
                   lambda p: unpack_ssd(p, layout, x.shape[0], B.shape[3]))


@ssd_scan.register_fake
def _(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max,
      packed_16bit):
    return x.new_empty(ssd_layout(x, B, _sequences(x, cu_seqlens), packed_16bit).shape,
                       dtype=packed_dtype(x, packed_16bit))


#: The differentiable inputs of ssd_scan, by position.
_SSD_GRAD_INPUTS = (0, 1, 2, 3, 4, 6, 7, 8, 9)  # x, dt, A, B, C, D, z, dt_bias, initial_states


@torch.library.custom_op("recurscan::ssd_scan_backward", mutates_args=())
def ssd_scan_backward(grad: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, chunk_size: int, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                      dt_bias: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
                      seq_idx: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], dt_softplus: bool,
                      dt_min: float, dt_max: float) -> list[torch.Tensor]:
    """The gradients of :func:`ssd_scan` for x, dt, A, B, C, D, z, dt_bias and initial_states (an
    absent input's entry is an empty tensor): the forward again under autograd
    (:func:`grads_by_autograd`; the oracle on CPU tensors, the GLA kernels' backward on CUDA)."""
    args = [x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min,
            dt_max]
    layout = ssd_layout(x, B, _sequences(x, cu_seqlens))
    dy, dfinal = unpack_ssd(grad, layout, x.shape[0], B.shape[3])

    def forward(*xs):
        full = list(args)
        for i, t in zip(_SSD_GRAD_INPUTS, xs):
            full[i] = t
        return _ssd_forward(*full)

    grads = grads_by_autograd(forward, [args[i] for i in _SSD_GRAD_INPUTS], (dy.to(x.dtype), dfinal))
    return [x.new_empty(0) if args[i] is None else (torch.zeros_like(args[i]) if d is None else
                                                    d.to(args[i].dtype)).contiguous()
            for i, d in zip(_SSD_GRAD_INPUTS, grads)]


@ssd_scan_backward.register_fake
def _(grad, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min,
      dt_max):
    args = [x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states]
    return [x.new_empty(0) if args[i] is None else args[i].new_empty(args[i].shape) for i in _SSD_GRAD_INPUTS]


def _ssd_setup_context(ctx, inputs, output):
    tensors = [inputs[i] for i in (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11)]
    ctx.save_for_backward(*tensors)
    ctx.options = (inputs[5], inputs[12], inputs[13], inputs[14], inputs[15])


def _ssd_backward(ctx, grad):
    x, dt, A, B, C, D, z, dt_bias, h0, seq_idx, cu = ctx.saved_tensors
    chunk_size, softplus, dt_min, dt_max, packed_16bit = ctx.options
    _refuse_16bit_backward(packed_16bit)
    grads = torch.ops.recurscan.ssd_scan_backward(grad, x, dt, A, B, C, chunk_size, D, z, dt_bias, h0, seq_idx, cu,
                                                  softplus, dt_min, dt_max)
    inputs = (x, dt, A, B, C, D, z, dt_bias, h0)
    dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dh0 = (None if t is None else d for t, d in zip(inputs, grads))
    return dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, dh0, None, None, None, None, None, None


torch.library.register_autograd("recurscan::ssd_scan", _ssd_backward, setup_context=_ssd_setup_context)


def traced_ssd(x, dt, A, B, C, *, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
               dt_limit):
    """What ``mamba_chunk_scan_combined`` returns while it is being traced: ``(y, final states)``
    from one ``ssd_scan`` node (y cast to x's dtype)."""
    packed_16bit = packs_16bit(x, x.shape[3], dt, A, B, C, D, z, dt_bias, initial_states)
    packed = torch.ops.recurscan.ssd_scan(x, dt, A, B, C, int(chunk_size), D, z, dt_bias, initial_states, seq_idx,
                                          cu_seqlens, bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]),
                                          packed_16bit)
    y, final = unpack_ssd(packed, ssd_layout(x, B, _sequences(x, cu_seqlens), packed_16bit), x.shape[0], B.shape[3])
    return y.to(x.dtype), final


def _gla_forward(q, k, v, g, per_key_decay, scale, initial_state, g_gamma, cu_seqlens, chunk_indices, chunk_offsets,
                 out=None):
    from .gla import _run_gla
    return _run_gla(q, k, v, g, per_key_decay=per_key_decay, scale=scale, initial_state=initial_state,
                    output_final_state=True, cu_seqlens=cu_seqlens, g_gamma=g_gamma, chunk_indices=chunk_indices,
                    chunk_offsets=chunk_offsets, backend=BACKEND, out_views=out)


@torch.library.custom_op("recurscan::gla_scan", mutates_args=(), tags=FLEXIBLE)
def gla_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], per_key_decay: bool,
             scale: float, initial_state: Optional[torch.Tensor], g_gamma: Optional[torch.Tensor],
             cu_seqlens: Optional[torch.Tensor], chunk_indices: Optional[torch.Tensor],
             chunk_offsets: Optional[torch.Tensor], packed_16bit: bool) -> torch.Tensor:
    """Gated linear attention (``chunk_simple_gla``, or ``chunk_gla`` with ``per_key_decay``) with
    its packed result ``[1, HV, B*T + N*K, V]`` (the delta rule's layout; ``packed_16bit`` as
    :func:`delta_rule_scan`)."""
    layout = delta_layout(q, v, _sequences(q, cu_seqlens), packed_16bit)
    return _packed(layout, q, lambda out: _gla_forward(q, k, v, g, per_key_decay, scale, initial_state, g_gamma,
                                                       cu_seqlens, chunk_indices, chunk_offsets, out),
                   lambda p: unpack_delta(p, layout, q.shape[0], q.shape[3]))


@gla_scan.register_fake
def _(q, k, v, g, per_key_decay, scale, initial_state, g_gamma, cu_seqlens, chunk_indices, chunk_offsets,
      packed_16bit):
    return q.new_empty(delta_layout(q, v, _sequences(q, cu_seqlens), packed_16bit).shape,
                       dtype=packed_dtype(q, packed_16bit))


@torch.library.custom_op("recurscan::gla_scan_backward", mutates_args=())
def gla_scan_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                      per_key_decay: bool, scale: float, initial_state: Optional[torch.Tensor],
                      g_gamma: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                      chunk_indices: Optional[torch.Tensor], chunk_offsets: Optional[torch.Tensor]
                      ) -> list[torch.Tensor]:
    """The gradients ``[dq, dk, dv, dg, dinitial_state, dg_gamma]`` of :func:`gla_scan` (an absent
    input's entry is an empty tensor): the forward again under autograd (:func:`grads_by_autograd`)."""
    inputs = [q, k, v, g, initial_state, g_gamma]
    layout = delta_layout(q, v, _sequences(q, cu_seqlens))
    do, dht = unpack_delta(grad, layout, q.shape[0], q.shape[3])
    grads = grads_by_autograd(
        lambda q_, k_, v_, g_, h0_, gamma_: _gla_forward(q_, k_, v_, g_, per_key_decay, scale, h0_, gamma_, cu_seqlens,
                                                         chunk_indices, chunk_offsets),
        inputs, (do.to(q.dtype), dht))
    return [q.new_empty(0) if t is None else (torch.zeros_like(t) if d is None else d.to(t.dtype)).contiguous()
            for t, d in zip(inputs, grads)]


@gla_scan_backward.register_fake
def _(grad, q, k, v, g, per_key_decay, scale, initial_state, g_gamma, cu_seqlens, chunk_indices, chunk_offsets):
    return [q.new_empty(0) if t is None else t.new_empty(t.shape) for t in (q, k, v, g, initial_state, g_gamma)]


def _gla_setup_context(ctx, inputs, output):
    q, k, v, g, per_key, scale, h0, g_gamma, cu, ci, co, packed_16bit = inputs
    ctx.save_for_backward(q, k, v, g, h0, g_gamma, cu, ci, co)
    ctx.options = (per_key, scale, packed_16bit)


def _gla_backward(ctx, grad):
    q, k, v, g, h0, g_gamma, cu, ci, co = ctx.saved_tensors
    per_key, scale, packed_16bit = ctx.options
    _refuse_16bit_backward(packed_16bit)
    grads = torch.ops.recurscan.gla_scan_backward(grad, q, k, v, g, per_key, scale, h0, g_gamma, cu, ci, co)
    dq, dk, dv, dg, dh0, dgamma = (None if t is None else d for t, d in zip((q, k, v, g, h0, g_gamma), grads))
    return dq, dk, dv, dg, None, None, dh0, dgamma, None, None, None, None


torch.library.register_autograd("recurscan::gla_scan", _gla_backward, setup_context=_gla_setup_context)


def traced_gla(q, k, v, g, *, per_key_decay, scale, initial_state, output_final_state, g_gamma, cu_seqlens,
               chunk_indices, chunk_offsets):
    """What ``chunk_simple_gla`` / ``chunk_gla`` return while being traced: one ``gla_scan`` node."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    packed_16bit = packs_16bit(q, v.shape[3], k, v, g, initial_state, g_gamma)
    packed = torch.ops.recurscan.gla_scan(q, k, v, g, bool(per_key_decay), scale, initial_state, g_gamma, cu_seqlens,
                                          chunk_indices, chunk_offsets, packed_16bit)
    y, state = unpack_delta(packed, delta_layout(q, v, _sequences(q, cu_seqlens), packed_16bit), q.shape[0],
                            q.shape[3])
    return y.to(q.dtype), (state if output_final_state else None)
