"""Validation and shape conventions, in one place.

Every public op turns its arguments into a Problem here before anything runs. A bad argument
gets a ValueError or TypeError that names it and says what was expected, e.g.

    ValueError: k: expected shape [B, T*M, H, K] = [1, 128, 4, 64], got [1, 128, 4, 32]

Conventions (docs/architecture.md): inputs [B, T, heads, dim] with tokens before heads; varlen is
B = 1 plus cu_seqlens [N + 1]; states [N, HV, K, V] (SSD: [N, H, P, Nstate]) in float32.

Checks that read tensor *values* (cu_seqlens monotone, state slots unique) run only on CPU
tensors: on a GPU they would synchronise the host, which a captured op must never do.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
STATE_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _names(dtypes) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


#: Dimensions a call cannot have empty (heads, head and state sizes): a zero there has no meaning,
#: where B, T and the sequence count N may be 0 or empty.
POSITIVE_DIMS = frozenset({"H", "HV", "K", "V", "P", "G", "Nstate"})


class Dims:
    """Named dimensions bound by the first argument that shows them, checked on every other.

    >>> import torch
    >>> from recurscan.problem import Dims
    >>> d = Dims(M=2)
    >>> d.check("q", torch.zeros(1, 4, 2, 8), "B T H K")
    >>> d.check("k", torch.zeros(1, 8, 2, 8), "B T*M H K")
    >>> d["T"], d["K"]
    (4, 8)
    """

    def __init__(self, **known: int):
        self.sizes: dict[str, int] = dict(known)

    def __getitem__(self, name: str) -> int:
        return self.sizes[name]

    def _expected(self, spec: list[str]) -> int | None:
        """The size a spec term demands (a name, a literal, or a product a*b), if known yet."""
        size = 1
        for factor in spec:
            if factor.isdigit():
                size *= int(factor)
            elif factor in self.sizes:
                size *= self.sizes[factor]
            else:
                return None
        return size

    def _shown(self, term: str) -> str:
        """A spec term as an error message shows it: its size if known yet, else its name."""
        want = self._expected(term.split("*"))
        return term if want is None else str(want)

    def check(self, name: str, x: torch.Tensor, spec: str) -> None:
        terms = spec.split()
        shown = "[" + ", ".join(terms) + "]"
        if x.dim() != len(terms):
            raise ValueError(f"{name}: expected {len(terms)} dimensions {shown}, got shape {list(x.shape)}")
        for term, size in zip(terms, x.shape):
            if size == 0 and term in POSITIVE_DIMS:
                raise ValueError(f"{name}: dimension {term} is 0 in shape {list(x.shape)}; expected at least 1")
            factors = term.split("*")
            want = self._expected(factors)
            if want is None and len(factors) == 1:
                self.sizes[term] = size
            elif want is None:  # a product with one unknown factor: solve for it
                unknown = [f for f in factors if not f.isdigit() and f not in self.sizes]
                known = self._expected([f for f in factors if f not in unknown]) or 1
                if len(unknown) == 1 and size % known == 0:
                    self.sizes[unknown[0]] = size // known
                else:
                    raise ValueError(f"{name}: dimension {term} = {size} is not a multiple of {known}")
            elif want != size:
                bound = "[" + ", ".join(self._shown(t) for t in terms) + "]"
                raise ValueError(f"{name}: expected shape {shown} = {bound}, got {list(x.shape)}")


def contiguous_indices(*tensors):
    """The call's index tensors (cu_seqlens, state_indices, the chunk descriptors,
    num_accepted_tokens, state_batch_indices, seq_idx) as the kernels read them: contiguous. A
    kernel reads an index tensor by element offset, not through its strides, so a strided view
    passed as it is would name other slots (writing a cache slot the call does not own) and other
    boundaries. None and non-tensors (a list of boundaries) pass as they are; a contiguous tensor
    is returned itself (no copy, no sync)."""
    for t in tensors:
        # type() first: isinstance against torch.Tensor goes through its metaclass (~0.1 us a test),
        # and this runs on every decode call
        if t is not None and (type(t) is not torch.Tensor or not t.is_contiguous()):
            return tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in tensors)
    return tensors


def needs_grad(*tensors) -> bool:
    """Whether autograd records a call on these arguments: grad mode on and any of them a tensor
    that requires grad (None and non-tensors pass)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if type(t) is torch.Tensor:  # as in contiguous_indices: the exact type test first
            if t.requires_grad:
                return True
        elif isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def check_tensor(name, x, dtypes, device=None) -> None:
    """x is a tensor of one of ``dtypes`` (on ``device`` when given)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_names(dtypes)}, got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (where q is), got {x.device}")


def check_scale(scale) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    try:
        finite = scale is None or math.isfinite(scale)
    except OverflowError:  # an int past float's range
        finite = False
    if not finite:  # NaN or inf: every output would be NaN or inf
        raise ValueError(f"scale: expected a finite number, got {scale}")


def check_cu_seqlens(cu_seqlens, batch: int, length: int, device) -> int:
    """Validate ``cu_seqlens [N + 1]`` for an input of ``batch`` rows and ``length`` tokens; return N."""
    check_tensor("cu_seqlens", cu_seqlens, INDEX_DTYPES, device)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens: expected shape [N + 1] with N >= 1, got {list(cu_seqlens.shape)}")
    if batch != 1:
        raise ValueError(f"cu_seqlens: variable-length input needs batch size B = 1, got B = {batch}")
    if cu_seqlens.device.type == "cpu":
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != length:
            raise ValueError(f"cu_seqlens: expected to start at 0 and end at T = {length}, got {bounds[0]} .. {bounds[-1]}")
        if any(b < a for a, b in zip(bounds, bounds[1:])):
            raise ValueError("cu_seqlens: expected non-decreasing boundaries")
    return cu_seqlens.numel() - 1


def check_state_cache(state, state_indices, dims: Dims, spec: str, device) -> None:
    """An in-place state cache ``state [S, ...]`` addressed by ``state_indices [N]`` (-1: padding)."""
    if (state is None) != (state_indices is None):
        missing = "state_indices" if state_indices is None else "state"
        raise ValueError(f"{missing}: state and state_indices are given together (the cache and its slots)")
    if state is None:
        return
    check_tensor("state", state, STATE_DTYPES, device)
    dims.check("state", state, spec)
    check_distinct_elements("state", state)
    check_tensor("state_indices", state_indices, INDEX_DTYPES, device)
    dims.check("state_indices", state_indices, "N")
    if state_indices.device.type == "cpu":
        check_slots("state_indices", state_indices, state.shape[0])


def check_distinct_elements(name: str, x: torch.Tensor) -> None:
    """A tensor written in place has no two elements at one address: no dimension of size > 1 with
    stride 0 (an expanded tensor), whose writes would land in each other's slots."""
    shared = [d for d in range(x.dim()) if x.shape[d] > 1 and x.stride(d) == 0]
    if shared:
        raise ValueError(f"{name}: dimension {shared[0]} has stride 0 (an expanded tensor: its elements share "
                         f"memory); expected a tensor written in place to have distinct elements")


def check_slots(name: str, slots: torch.Tensor, num_slots: int) -> None:
    """Cache slots (a CPU tensor) in ``[0, num_slots)`` or -1 for padding, no slot named twice."""
    values = slots.tolist()
    for i, s in enumerate(values):
        if s < -1 or s >= num_slots:
            raise ValueError(f"{name}: expected slots in [0, {num_slots}) or -1 for padding; entry {i} is {s}")
    live = [s for s in values if s != -1]
    if len(set(live)) != len(live):
        raise ValueError(f"{name}: a slot is named twice; each sequence must own its slot")


def _check_qkv(q, k, v, dims: "Dims", k_spec: str, v_spec: str) -> torch.device:
    """q ``[B, T, H, K]``, k and v by their specs: floating tensors of one dtype on one device, and
    value heads a multiple of the q/k heads (grouped value attention). Returns the device."""
    check_tensor("q", q, FLOAT_DTYPES)
    for name, x in (("k", k), ("v", v)):
        check_tensor(name, x, FLOAT_DTYPES, q.device)
        if x.dtype != q.dtype:
            raise TypeError(f"{name}: expected the dtype of q ({q.dtype}), got {x.dtype}")
    dims.check("q", q, "B T H K")
    dims.check("k", k, k_spec)
    dims.check("v", v, v_spec)
    if dims["HV"] % dims["H"] != 0:
        raise ValueError(f"v: value heads HV = {dims['HV']} must be a multiple of the q/k heads H = {dims['H']}")
    return q.device


@dataclass(frozen=True)
class DeltaProblem:
    """A validated Gated DeltaNet / Gated Delta Product call (GDN is M = 1)."""

    batch: int
    tokens: int  # T on the token stream
    heads: int  # H (q, k)
    value_heads: int  # HV (v, g, beta)
    key_dim: int
    value_dim: int
    sequences: int  # N
    householder: int  # M
    beta_per_value: bool
    scale: float
    varlen: bool
    uses_cache: bool
    device: torch.device
    dtype: torch.dtype
    state_bytes: int = 4  # element size of the state read (the cache, or initial_state)
    state_key_contiguous: bool = False  # that state is a [.., V, K] tensor seen transposed


def key_contiguous(state) -> bool:
    """Whether a ``[.., K, V]`` state tensor is a transposed view of a ``[.., V, K]`` one (key rows
    contiguous: the layout of vLLM's, SGLang's and FlashInfer's caches, and of fla's
    ``state_v_first``). The streaming kernel's launch rule gives such states key-contiguous tiles,
    and the decode op lays out a new final state like its initial state by it."""
    return state is not None and state.shape[-2] > 1 and state.stride(-2) == 1 and state.stride(-1) != 1


def check_householder(num_householder) -> None:
    """M, the Householder copies of Gated Delta Product: an int >= 1 (1 is Gated DeltaNet)."""
    if isinstance(num_householder, bool) or not isinstance(num_householder, int) or num_householder < 1:
        raise ValueError(f"num_householder: expected an int >= 1, got {num_householder!r}")


def delta_problem(q, k, v, g, beta, *, num_householder=1, scale=None, initial_state=None,
                  cu_seqlens=None, state=None, state_indices=None, output_final_state=False,
                  state_v_first=False) -> DeltaProblem:
    """Validate a delta-rule call: q ``[B, T, H, K]``, k ``[B, T*M, H, K]``, v ``[B, T*M, HV, V]``,
    g ``[B, T, HV]`` or None, beta ``[B, T*M, HV]`` / ``[B, T*M, HV, V]`` or None; states
    ``[.., HV, K, V]``, or ``[.., HV, V, K]`` with ``state_v_first`` (checked in the caller's
    layout; the op reads them through their transposed view)."""
    check_householder(num_householder)
    dims = Dims(M=num_householder)
    device = _check_qkv(q, k, v, dims, "B T*M H K", "B T*M HV V")
    if g is not None:
        check_tensor("g", g, FLOAT_DTYPES, device)
        dims.check("g", g, "B T HV")
    beta_per_value = False
    if beta is not None:
        check_tensor("beta", beta, FLOAT_DTYPES, device)
        beta_per_value = beta.dim() == 4
        dims.check("beta", beta, "B T*M HV V" if beta_per_value else "B T*M HV")
    check_scale(scale)
    _check_common(dims, device, "B", "T", cu_seqlens, initial_state, "HV V K" if state_v_first else "HV K V", state,
                  state_indices)
    read_state = state if state is not None else initial_state
    if state_v_first and read_state is not None:
        read_state = read_state.transpose(-1, -2)  # the [.., K, V] view the op reads
    return DeltaProblem(
        batch=dims["B"], tokens=dims["T"], heads=dims["H"], value_heads=dims["HV"], key_dim=dims["K"],
        value_dim=dims["V"], sequences=dims["N"], householder=num_householder, beta_per_value=beta_per_value,
        scale=dims["K"] ** -0.5 if scale is None else float(scale), varlen=cu_seqlens is not None,
        uses_cache=state is not None, device=device, dtype=q.dtype,
        # the widest state the call reads or writes (a new final state is float32)
        state_bytes=max([t.element_size() for t in (read_state,) if t is not None]
                        + ([4] if (output_final_state and state is None) or read_state is None else [])),
        state_key_contiguous=key_contiguous(read_state))


def _check_common(dims: Dims, device, batch_dim: str, length_dim: str, cu_seqlens, initial_state, state_spec,
                  state=None, state_indices=None) -> int:
    """cu_seqlens, initial_state and the state cache, the same way for every family; returns N."""
    if cu_seqlens is not None:
        dims.sizes["N"] = check_cu_seqlens(cu_seqlens, dims[batch_dim], dims[length_dim], device)
    else:
        dims.sizes["N"] = dims[batch_dim]
    if initial_state is not None:
        if state is not None:
            raise ValueError("initial_state: pass either initial_state or the state cache (state, state_indices)")
        check_tensor("initial_state", initial_state, STATE_DTYPES, device)
        dims.check("initial_state", initial_state, "N " + state_spec)
    check_state_cache(state, state_indices, dims, "S " + state_spec, device)
    return dims["N"]


@dataclass(frozen=True)
class GlaProblem:
    """A validated gated-linear-attention call (scalar or per-key decay)."""

    batch: int
    tokens: int
    heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    sequences: int
    per_key_decay: bool
    scale: float
    device: torch.device
    dtype: torch.dtype
    uses_cache: bool = False  # a state cache (state, state_indices) in place of initial / final states


def gla_problem(q, k, v, g, *, per_key_decay, scale=None, initial_state=None, cu_seqlens=None,
                g_gamma=None, state=None, state_indices=None, chunk_indices=None, chunk_offsets=None) -> GlaProblem:
    """q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]`` (per key) or ``[B, T, HV]``;
    g_gamma ``[HV]`` (a constant log decay per head, scalar decay only); states ``[N, HV, K, V]``,
    a cache ``[S, HV, K, V]`` with ``state_indices [N]``; varlen descriptors as
    :func:`check_chunk_descriptors` takes them (unused without cu_seqlens)."""
    dims = Dims()
    device = _check_qkv(q, k, v, dims, "B T H K", "B T HV V")
    if g is not None:
        check_tensor("g", g, FLOAT_DTYPES, device)
        dims.check("g", g, "B T HV K" if per_key_decay else "B T HV")
    if g_gamma is not None:
        check_tensor("g_gamma", g_gamma, FLOAT_DTYPES, device)
        dims.check("g_gamma", g_gamma, "HV")
    check_scale(scale)
    n = _check_common(dims, device, "B", "T", cu_seqlens, initial_state, "HV K V", state, state_indices)
    if cu_seqlens is not None:
        check_chunk_descriptors(cu_seqlens, chunk_indices, None, chunk_offsets, 1, device)
    return GlaProblem(dims["B"], dims["T"], dims["H"], dims["HV"], dims["K"], dims["V"], n, per_key_decay,
                      dims["K"] ** -0.5 if scale is None else float(scale), device, q.dtype,
                      uses_cache=state is not None)


@dataclass(frozen=True)
class SsdProblem:
    """A validated Mamba2 SSD call (mamba_ssm's parameterisation)."""

    batch: int
    tokens: int
    heads: int
    head_dim: int  # P
    groups: int  # G
    state_dim: int  # Nstate
    sequences: int
    device: torch.device
    dtype: torch.dtype
    uses_cache: bool = False  # a state cache (state, state_indices) in place of initial / final states
    gated: bool = False  # a gate z


def check_dt_limit(dt_limit) -> None:
    if not (isinstance(dt_limit, (tuple, list)) and len(dt_limit) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in dt_limit)):
        raise TypeError(f"dt_limit: expected a pair (min, max) of floats, got {dt_limit!r}")
    if any(x != x for x in dt_limit):  # NaN: every comparison is False, so min <= max would let it by
        raise ValueError(f"dt_limit: expected a pair (min, max) without NaN, got {tuple(dt_limit)}")
    for x in dt_limit:
        try:
            float(x)
        except OverflowError:  # an int past float's range (the kernels take the bounds as floats)
            raise ValueError(f"dt_limit: expected bounds within float's range (float('inf') for none), got {x}") \
                from None
    if dt_limit[0] > dt_limit[1]:
        raise ValueError(f"dt_limit: expected min <= max, got {tuple(dt_limit)}")


def check_dt_softplus(dt_softplus) -> None:
    """A real bool: the ops branch on it, so a string or a number would pass for True or False."""
    if not isinstance(dt_softplus, bool):
        raise TypeError(f"dt_softplus: expected a bool, got {type(dt_softplus).__name__} {dt_softplus!r}")


def ssd_problem(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                initial_state=None, cu_seqlens=None, state=None, state_indices=None, seq_idx=None,
                chunk_indices=None, chunk_offsets=None) -> SsdProblem:
    """x ``[Bt, T, H, P]``, dt ``[Bt, T, H]``, A ``[H]``, B/C ``[Bt, T, G, Nstate]`` (H % G == 0),
    D ``[H]`` or ``[H, P]``, z ``[Bt, T, H, P]``, dt_bias ``[H]``; states ``[N, H, P, Nstate]``;
    seq_idx ``[Bt, T]`` integer (without cu_seqlens: a state cache is refused with it)."""
    check_tensor("x", x, FLOAT_DTYPES)
    device = x.device
    dims = Dims()
    dims.check("x", x, "Bt T H P")
    for name, t, spec in (("dt", dt, "Bt T H"), ("A", A, "H"), ("B", B, "Bt T G Nstate"),
                          ("C", C, "Bt T G Nstate")):
        check_tensor(name, t, FLOAT_DTYPES, device)
        dims.check(name, t, spec)
    if dims["H"] % dims["G"] != 0:
        raise ValueError(f"B: groups G = {dims['G']} must divide the heads H = {dims['H']}")
    if D is not None:
        check_tensor("D", D, FLOAT_DTYPES, device)
        dims.check("D", D, "H P" if D.dim() == 2 else "H")
    for name, t, spec in (("z", z, "Bt T H P"), ("dt_bias", dt_bias, "H")):
        if t is not None:
            check_tensor(name, t, FLOAT_DTYPES, device)
            dims.check(name, t, spec)
    check_dt_softplus(dt_softplus)
    check_dt_limit(dt_limit)
    if seq_idx is not None:
        check_tensor("seq_idx", seq_idx, INDEX_DTYPES, device)
        dims.check("seq_idx", seq_idx, "Bt T")
        if state is not None and cu_seqlens is None:
            raise ValueError("seq_idx: a state cache (state, state_indices) takes one sequence a row; pass "
                             "cu_seqlens to pack sequences with a cache")
    n = _check_common(dims, device, "Bt", "T", cu_seqlens, initial_state, "H P Nstate", state, state_indices)
    if cu_seqlens is not None:
        check_chunk_descriptors(cu_seqlens, chunk_indices, None, chunk_offsets, 1, device)
    return SsdProblem(dims["Bt"], dims["T"], dims["H"], dims["P"], dims["G"], dims["Nstate"], n, device, x.dtype,
                      uses_cache=state is not None, gated=z is not None)


@dataclass(frozen=True)
class DiagonalProblem:
    batch: int
    tokens: int
    width: int
    sequences: int
    device: torch.device
    dtype: torch.dtype


def diagonal_problem(a, b, *, initial_state=None, cu_seqlens=None) -> DiagonalProblem:
    """a, b ``[B, T, D]``; initial state ``[N, D]``."""
    check_tensor("b", b, FLOAT_DTYPES)
    check_tensor("a", a, FLOAT_DTYPES, b.device)
    dims = Dims()
    dims.check("b", b, "B T D")
    dims.check("a", a, "B T D")
    n = _check_common(dims, b.device, "B", "T", cu_seqlens, initial_state, "D")
    return DiagonalProblem(dims["B"], dims["T"], dims["D"], n, b.device, b.dtype)


def check_decode_extras(problem, state, intermediate_states, steps_per_token, num_accepted_tokens) -> None:
    """The speculative-decoding arguments of a recurrent (decode) call (fla's, plus
    ``num_accepted_tokens``): ``intermediate_states [S, >= T // steps_per_token, HV, K, V]`` at the
    cache slots, ``num_accepted_tokens [N]`` (int) read against that buffer. Reads values only on
    CPU tensors (:func:`check_accepted_tokens`)."""
    if isinstance(steps_per_token, bool) or not isinstance(steps_per_token, int) or steps_per_token < 1:
        raise ValueError(f"steps_per_token: expected an int >= 1, got {steps_per_token!r}")
    if intermediate_states is not None:
        if state is None:
            raise ValueError("intermediate_states: snapshots are written at cache slots; pass state and state_indices")
        check_tensor("intermediate_states", intermediate_states, STATE_DTYPES, problem.device)
        shape = list(intermediate_states.shape)
        need = None if problem.varlen else problem.tokens // steps_per_token
        if (len(shape) != 5 or shape[0] != state.shape[0] or shape[2:] != list(state.shape[1:])
                or (need is not None and shape[1] < need)):
            raise ValueError(f"intermediate_states: expected shape [S, T // steps_per_token, HV, K, V] with "
                             f"[S, HV, K, V] = {list(state.shape)}"
                             + (f" and T // steps_per_token = {need}" if need is not None else "")
                             + f", got {shape}")
        check_distinct_elements("intermediate_states", intermediate_states)  # written in place, as the cache
    if num_accepted_tokens is not None:
        if intermediate_states is None:
            raise ValueError("num_accepted_tokens: requests restart from their snapshots; pass intermediate_states "
                             "(and the state cache)")
        check_tensor("num_accepted_tokens", num_accepted_tokens, INDEX_DTYPES, problem.device)
        if list(num_accepted_tokens.shape) != [problem.sequences]:
            raise ValueError(f"num_accepted_tokens: expected shape [N] = [{problem.sequences}], "
                             f"got {list(num_accepted_tokens.shape)}")
        check_accepted_tokens(num_accepted_tokens, intermediate_states.shape[1])


def check_accepted_tokens(num_accepted_tokens, snapshots: int) -> None:
    """``num_accepted_tokens`` against a snapshot buffer of ``snapshots`` entries a request: each
    value a in ``[0, snapshots]`` (0: start from the cache slot's state; a > 0: from snapshot
    a - 1), every entry, padding requests' included. Read on CPU tensors only (on a GPU it would
    synchronise the host; the kernel treats a < 0 as 0 and clamps a > snapshots to snapshots,
    reading nothing outside the buffer)."""
    if num_accepted_tokens.device.type != "cpu":
        return
    for i, a in enumerate(num_accepted_tokens.tolist()):
        if not 0 <= a <= snapshots:
            raise ValueError(f"num_accepted_tokens: expected values in [0, {snapshots}] (0: the cache slot's state, "
                             f"a: snapshot a - 1 of intermediate_states, which holds {snapshots}); entry {i} is {a}")


@dataclass(frozen=True)
class SsdDecodeProblem:
    """A validated Mamba2 decode call (mamba_ssm's selective_state_update shapes)."""

    batch: int
    tokens: int  # draft tokens per request (1 without a token dimension)
    heads: int
    head_dim: int  # P (dim)
    groups: int
    state_dim: int  # N (dstate)
    slots: int  # S
    sequences: int  # = batch
    device: torch.device
    dtype: torch.dtype
    state_bytes: int = 4


def ssd_decode_problem(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                       state_batch_indices=None, intermediate_states=None,
                       num_accepted_tokens=None) -> SsdDecodeProblem:
    """Validate a ``selective_state_update`` call: mamba_ssm's with-heads form (state
    ``[S, H, P, N]``, x ``[b, H, P]``), its no-heads form (state ``[S, P, N]``, x ``[b, P]``), or
    draft tokens (x ``[b, T, H, P]``, B/C ``[b, T, G, N]``). Reads values only on CPU tensors."""
    check_tensor("state", state, STATE_DTYPES)
    device = state.device
    check_tensor("x", x, FLOAT_DTYPES, device)
    if state.dim() not in (3, 4):
        raise ValueError(f"state: expected [S, nheads, dim, dstate] or [S, dim, dstate], got shape {list(state.shape)}")
    heads = state.dim() == 4
    tokens = heads and x.dim() == 4
    d = Dims(H=1, G=1) if not heads else Dims()
    if heads:
        tok = "b T " if tokens else "b "
        specs = {"state": "S H P N", "x": tok + "H P", "dt": tok + "H P", "A": "H P N", "B": tok + "G N",
                 "C": tok + "G N", "D": "H P", "z": tok + "H P", "dt_bias": "H P", "snap": "S T H P N"}
    else:
        specs = {"state": "S P N", "x": "b P", "dt": "b P", "A": "P N", "B": "b N", "C": "b N", "D": "P",
                 "z": "b P", "dt_bias": "P", "snap": "S T P N"}
    d.check("state", state, specs["state"])
    check_distinct_elements("state", state)
    d.check("x", x, specs["x"])
    for name, t in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias)):
        if t is None and name in ("D", "z", "dt_bias"):
            continue
        check_tensor(name, t, FLOAT_DTYPES, device)
        d.check(name, t, specs[name])
    check_dt_softplus(dt_softplus)
    if d["H"] % d["G"] != 0:
        raise ValueError(f"B: ngroups = {d['G']} must divide nheads = {d['H']}")
    T = d["T"] if tokens else 1
    b, S = d["b"], d["S"]
    if state_batch_indices is None:
        if S < b:
            raise ValueError(f"state: without state_batch_indices request i uses slot i, so the cache needs "
                             f">= {b} slots, got {S}")
    else:
        check_tensor("state_batch_indices", state_batch_indices, INDEX_DTYPES, device)
        d.check("state_batch_indices", state_batch_indices, "b")
        if state_batch_indices.device.type == "cpu":
            vals = state_batch_indices.tolist()
            if any(s < -1 or s >= S for s in vals):
                raise ValueError(f"state_batch_indices: expected slots in [0, {S}) or -1 for padding")
            live = [s for s in vals if s != -1]
            if len(set(live)) != len(live):
                raise ValueError("state_batch_indices: a slot is named twice; each request must own its slot")
    if intermediate_states is not None:
        check_tensor("intermediate_states", intermediate_states, STATE_DTYPES, device)
        d.sizes.setdefault("T", T)
        d.check("intermediate_states", intermediate_states, specs["snap"])
        check_distinct_elements("intermediate_states", intermediate_states)
    if num_accepted_tokens is not None:
        if intermediate_states is None:
            raise ValueError("num_accepted_tokens: requests restart from their snapshots; pass intermediate_states")
        check_tensor("num_accepted_tokens", num_accepted_tokens, INDEX_DTYPES, device)
        d.check("num_accepted_tokens", num_accepted_tokens, "b")
        check_accepted_tokens(num_accepted_tokens, intermediate_states.shape[1])
    return SsdDecodeProblem(b, T, d["H"], d["P"], d["G"], d["N"], S, b, device, x.dtype, state.element_size())


def debug_checks() -> bool:
    """``RECURSCAN_CHECK=1``: validate device-resident descriptors too (one host sync a call)."""
    return os.environ.get("RECURSCAN_CHECK", "0") == "1"


def check_chunk_descriptors(cu_seqlens, chunk_indices, chunk_indices_dp, chunk_offsets, num_householder: int,
                            device) -> None:
    """Varlen descriptors given by the caller (``recurscan.descriptors``): int tensors on ``device``
    of shapes ``[R, 2]``, ``[R_dp, 2]`` and ``[N + 1]``. Their values are compared with the
    descriptors of ``cu_seqlens`` (every real chunk once, sequence-major, then padding rows whose
    sequence is -1) when they are on the CPU, or on any device under ``RECURSCAN_CHECK=1`` (one
    host sync); on a GPU without it the kernels bound every index, so a wrong descriptor gives
    wrong numbers but never reads or writes outside a tensor."""
    named = (("chunk_indices", chunk_indices, 2), ("chunk_indices_dp", chunk_indices_dp, 2),
             ("chunk_offsets", chunk_offsets, 1))
    for name, x, dim in named:
        if x is None:
            continue
        check_tensor(name, x, INDEX_DTYPES, device)
        if dim == 2 and (x.dim() != 2 or x.shape[1] != 2):
            raise ValueError(f"{name}: expected shape [chunks, 2] of (sequence, chunk) rows, got {list(x.shape)}")
        if dim == 1 and list(x.shape) != [cu_seqlens.numel()]:
            raise ValueError(f"{name}: expected shape [N + 1] = [{cu_seqlens.numel()}], got {list(x.shape)}")
    given = [(n, x) for n, x, _ in named if x is not None and not (n == "chunk_indices_dp" and x is chunk_indices)]
    if not given or not (debug_checks() or all(x.device.type == "cpu" for _, x in given)):
        return
    bounds = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if any(L < 0 for L in lengths) or bounds[0] != 0:  # only reachable for device tensors
        raise ValueError(f"cu_seqlens: expected non-decreasing boundaries from 0, got {bounds}")
    from .descriptors import CHUNK_SIZE, chunk_offsets_of, chunk_pairs
    for name, x in given:
        M = num_householder if name == "chunk_indices_dp" else 1
        if name == "chunk_offsets":
            for i, (a, b) in enumerate(zip(x.tolist(), chunk_offsets_of(lengths))):
                if a != b:
                    raise ValueError(f"chunk_offsets: entry {i} is {a}, expected {b} for cu_seqlens {bounds}")
            continue
        want = chunk_pairs([L * M for L in lengths])
        rows = [tuple(r) for r in x.tolist()]
        if len(rows) < len(want):
            raise ValueError(f"{name}: {len(rows)} rows, fewer than the {len(want)} chunks of cu_seqlens "
                             f"{bounds} (chunks of {CHUNK_SIZE} rows" + (f", stream x{M})" if M > 1 else ")"))
        for i, r in enumerate(rows):
            expected = want[i] if i < len(want) else None
            if (expected is not None and r != expected) or (expected is None and r[0] != -1):
                raise ValueError(f"{name}: row {i} is {list(r)}, expected "
                                 + (f"{list(expected)} (sequence, chunk)" if expected else "[-1, -1] (padding)")
                                 + f" for cu_seqlens {bounds}")
