"""The launches of the chunked delta rule, built from the planner's DeltaShape: buffers, grids,
argument records and the launch sequence (prep, sweep; segments with a fix-up, or phases; then the
replay of programs whose state came out non-finite). No decisions here: the shape decides, and
this file turns it into launches. The design is in docs/kernels-chunk-delta.md.

A call signature's launches are built once (:func:`build_delta_launches`, kept by the op's
signature cache) and run on each call's tensors (:func:`run_delta_launches`): the first run
launches through Triton's JIT (every kernel compiled together), later runs launch the compiled
kernels directly (runtime/launcher.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..descriptors import CHUNK_SIZE
from ..kernels.delta.fixup import chunk_delta_fixup_kernel
from ..kernels.delta.prep import chunk_delta_prep_kernel
from ..kernels.delta.sweep import chunk_delta_sweep_kernel
from ..kernels.gla.group_prep import GROUP_COEF_WIDTH, chunk_group_prep_kernel
from ..kernels.gla.prep import chunk_gla_prep_kernel
from .delta_fused import fused_call_ok, fused_launch_steps
from ..plan import delta as plan_delta
from ..plan.delta import DeltaShape
from ..runtime.launcher import CallArg, DirectLaunch, compile_together, jit_launch, launches_programmatically

# Tests set this (or RECURSCAN_POISON_BUFFERS=1) so that every buffer the op allocates with
# torch.empty starts as NaN: an element the kernels forget to write then shows up.
POISON_BUFFERS = os.environ.get("RECURSCAN_POISON_BUFFERS", "0") == "1"
# Triton's interpreter (CPU tensors).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _empty(*shape, dtype, device):
    if POISON_BUFFERS:  # NaN, or -1 for integer buffers (an index no kernel may use)
        poison = float("nan") if dtype.is_floating_point else -1
        return torch.full(shape, poison, dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


class DeltaInputs(NamedTuple):
    """The per-call tensors of a delta-rule call, in the order the launches read them (None where absent)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor | None
    beta: torch.Tensor | None
    initial_state: torch.Tensor | None = None
    state: torch.Tensor | None = None
    state_indices: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    chunk_indices_dp: torch.Tensor | None = None
    chunk_offsets: torch.Tensor | None = None
    # Mamba2 SSD on the sweep (build_delta_launches' ``ssd``): raw step sizes, rates, bias, skip, gate.
    dt: torch.Tensor | None = None
    A: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None
    D: torch.Tensor | None = None
    z: torch.Tensor | None = None


def per_key_prep_steps(prep: dict, grid: tuple, calm, BK: int, options: dict, flags: CallArg) -> list:
    """The per-key prep's launches (kernels/gla/prep.py) from its arguments ``prep``: one launch
    of the general steps in ``options``; or, with ``calm`` ``(keys a step, warps, register cap)``,
    the calm pass then the general steps for the other chunks (8 warps, all keys at once), the
    chunks' flags in ``flags`` (an int8 buffer of ``grid[0]`` elements the caller allocates)."""
    if calm is None:
        return [Step(chunk_gla_prep_kernel, grid, dict(prep, calm_flags=prep["q"], CALM_PASS=0), options)]
    block, warps, maxnreg = calm
    return [Step(chunk_gla_prep_kernel, grid, dict(prep, calm_flags=flags, CALM_PASS=1, BKB=min(block, BK)),
                 dict(num_warps=warps, **({} if maxnreg is None else {"maxnreg": maxnreg}))),
            Step(chunk_gla_prep_kernel, grid, dict(prep, calm_flags=flags, CALM_PASS=2, BKB=0), dict(num_warps=8))]


def _group_prep_blocks(H: int, HV: int, scores: bool, most: int = 16) -> tuple[int, int]:
    """``(programs a chunk, HB)`` of the group prep: HB value heads a program, up to ``most``
    (DeltaShape.group_prep_heads) and at least 2 (a [64, 1] tile's cumulative sum fails Triton
    3.6's sm_90 lowering; the second column is masked); with ``scores`` each query/key head's value
    heads in blocks of their own (they share its scores), without them blocks of all HV (simple GLA
    B4 T4096 H16: 256 programs, not 4096)."""
    span = HV // H if scores else HV
    heads = max(2, min(most, triton.next_power_of_2(span)))
    return HV // span * triton.cdiv(span, heads), heads


def check_shape(shape: DeltaShape) -> None:
    """A launch shape the kernels can take (the planner's always are; a hand-made one may not be)."""
    for name in ("segments", "phases", "block_v", "num_warps", "num_stages", "prep_warps", "prep_heads"):
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"DeltaShape.{name}: expected an int >= 1, got {value!r}")
    for name in ("v_product", "tma_store", "key_calm_pass", "group_prep", "calm_gates", "sweep_scores",
                 "specialized", "fused", "chained"):
        if not isinstance(getattr(shape, name), bool):
            raise ValueError(f"DeltaShape.{name}: expected a bool, got {getattr(shape, name)!r}")
    if shape.calm_gates and shape.num_stages > 2:
        # H200, Triton 3.6.0: the sweep with CALM_GATES at 3 stages makes an illegal memory access
        # (with or without bulk stores; 2 stages and the gate tile at 3 do not); cause not isolated.
        raise ValueError(f"DeltaShape.calm_gates: takes num_stages <= 2 (got {shape.num_stages}); at 3 Triton 3.6's "
                         "sm_90 build of the calm sweep makes an illegal memory access")
    g = shape.group_prep_heads
    if not isinstance(g, int) or isinstance(g, bool) or not (2 <= g <= 64 and g & (g - 1) == 0):
        raise ValueError(f"DeltaShape.group_prep_heads: expected a power of two from 2 to 64, got {g!r}")
    b = shape.prep_key_block
    if not isinstance(b, int) or isinstance(b, bool) or not (b == 0 or (b >= 16 and b & (b - 1) == 0)):
        raise ValueError(f"DeltaShape.prep_key_block: expected 0 or a power of two >= 16, got {b!r}")
    r = shape.phase_ratio
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 2):
        raise ValueError(f"DeltaShape.phase_ratio: expected None or a number in (0, 2], got {r!r}")
    m = shape.prep_maxnreg
    if m is not None and (not isinstance(m, int) or isinstance(m, bool) or not 128 <= m <= 255):
        raise ValueError(f"DeltaShape.prep_maxnreg: expected None or an int in [128, 255], got {m!r}")
    lead = shape.chained_lead
    if isinstance(lead, bool) or not isinstance(lead, (int, float)) or not 0 <= lead < 1:
        raise ValueError(f"DeltaShape.chained_lead: expected a number in [0, 1), got {lead!r}")




def product_dtype(dtype: torch.dtype):
    """The Triton dtype of the products' operands for inputs of ``dtype``: the input dtype (bf16 or
    fp16 operands, float32 accumulation), except bf16 under the interpreter, which multiplies bf16
    tiles as raw uint16 bits (Triton 3.6): there they run in float32."""
    dt = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]
    return tl.float32 if dt == tl.bfloat16 and INTERPRET else dt


#: The per-call values of a call, in order: the inputs, then the buffers the call allocates.
INPUT_NAMES = DeltaInputs._fields
BUFFER_NAMES = ("o", "final", "chunk_states", "beta_ones", "wy", "aqk", "coef", "seg_n", "seg_m",
                "sequence_order", "replay_flags", "winv", "u", "ks", "checkpoints", "qg", "kg", "dl", "calm_flags",
                "scores", "vec", "dinv", "flags", "ready")
CALL_NAMES = INPUT_NAMES + BUFFER_NAMES
#: The prep's outputs, which a forward under autograd may keep for the backward (``keep_prep``).
PREP_NAMES = ("wy", "winv", "aqk", "coef")


def kept_prep_names(ranked: bool) -> tuple:
    """The buffers a kept prep hands the backward: :data:`PREP_NAMES`, and for a varlen batch
    (``ranked``) the sweep's order of sequences, which the prep writes too."""
    return PREP_NAMES + (("sequence_order",) if ranked else ())


@dataclass
class Step:
    """One kernel launch: per-call values in ``kwargs`` are ``CallArg`` names."""

    kernel: object
    grid: tuple
    kwargs: dict
    options: dict
    # A programmatic dependent of the previous launch (the direct launches; the first, through
    # Triton's JIT, is plain): it may start once every program of that launch has started or
    # triggered. Not a compile option, so one compiled kernel serves both kinds of launch.
    programmatic: bool = False
    min_shared: int = 0  # shared memory its direct launches reserve per program, at least
    direct: DirectLaunch | None = None  # the compiled kernel's direct launch, after the first call


@dataclass
class DeltaLaunches:
    """Everything a call of one signature needs but its tensors: the buffers to allocate
    (name -> (shape, dtype, fill); fill None = uninitialised, else a constant), the launches in
    order, and where each returned tensor sits in the call's values (None: a None output). Built
    once per signature; keeps no tensor. ``launched``: its first call has run (and compiled every
    kernel it launches)."""

    buffers: dict
    steps: list
    outputs: tuple
    device: torch.device
    launched: bool = False
    # The chained schedule (DeltaShape.chained): the index of its sweep's step, whose prep is the
    # next one; -1 without it. run_delta_launches orders the pair.
    chained: int = -1

    def __post_init__(self):  # names -> positions in CALL_NAMES, once rather than per call
        self.outputs = tuple(CALL_NAMES.index(n) if isinstance(n, str) else n for n in self.outputs)


def build_delta_launches(q, k, v, g, beta, shape: DeltaShape, *, num_householder=1, scale=None,
                         initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                         cu_seqlens=None, chunk_indices_dp=None, chunk_offsets=None, num_chunk_rows=None,
                         state=None, state_indices=None, return_chunk_states=False,
                         chunk_states_dtype=torch.float32, expanded_chunk_states=False,
                         keep_prep=False, checkpoint_chunks=0, wy=True, ssd=None, key_decay=False,
                         out_views=None, states_only=False) -> DeltaLaunches:
    """The launches of one call signature, in the launch ``shape`` the planner chose (the tensors'
    shapes and strides are read, never kept); arguments as :func:`chunk_delta_fwd`.
    ``chunk_states_dtype``: the backward keeps the chunk states in the inputs' dtype, which is the
    product operand the sweep took them as. ``expanded_chunk_states``: a state at every chunk of the
    expanded stream (rows from ``chunk_offsets`` of the expanded stream; GDP's backward).
    ``keep_prep``: the prep also writes G o Tinv, and the call returns the prep's outputs
    (:data:`PREP_NAMES`) after its own, for the backward (a forward under autograd).
    ``checkpoint_chunks`` E > 0 (dense only): the sweep also writes the float32 state entering every
    E-th token chunk, ``checkpoints [B, ceil(T / 64 / E), HV, K, V]``, returned last, from which the
    backward recomputes every segment of E chunks at once (launch/delta_backward.py).
    ``wy=False``: gated linear attention on these kernels (U = V: no beta, no inverse, no ``wy``;
    M = 1, no l2norm, forward only); with ``ssd`` (launch/gla.py's SsdPrologue: its flags are read
    here, its tensors passed per call as DeltaInputs' dt, A, dt_bias, D, z) Mamba2 SSD, v holding x,
    g None or ``[B, T]`` (seq_idx's resets), the outputs in v's dtype. ``key_decay`` (with
    ``wy=False``): fla's chunk_gla, g ``[B, T, HV, K]`` a log decay per key dimension; the prep is
    then kernels/gla/prep.py's (FOR_SWEEP: decayed queries and keys ``qg``, ``kg``, A, the chunk's
    decay per key ``dl``), one program per (chunk, value head), and the sweep runs with KEY_DECAY;
    single pass or segments (no phases: that prep has no phase range). ``shape.group_prep`` (a
    scalar decay with ``wy=False``): the prep is kernels/gla/group_prep.py's, one program per (chunk,
    query/key head), writing the scores ``[B, T, H, 64]`` (float32; q's dtype with calm gates) and
    coef rows of 8, and the sweep gates the scores per value head (GATE_SCORES);
    ``shape.calm_gates`` as well: factored where a chunk is calm (CALM_GATES; 2 stages at most).
    ``shape.sweep_scores`` instead: the sweep forms the scores from its q and k tiles
    (SWEEP_SCORES), and the group prep writes the coef rows alone.
    ``out_views``: ``(o, final)`` tensors each call writes into instead of new ones (passed per call as
    :func:`run_delta_launches`' ``given``; their strides are read here): o ``[B, T, HV, V]`` with a
    unit last stride and a batch stride of T token strides, final ``[N, HV, K, V]`` float32 with
    rows of V (the traced scan's packed result, ops/scan.py). ``states_only``: the sweep forms no
    outputs (OUTPUTS off, no replay launch; the calm gates' factors are the prep's alone): the GLA
    backward's recompute of the chunk states (launch/gla.py)."""
    check_shape(shape)
    if key_decay and (wy or ssd is not None or shape.phases != 1 or shape.prep_heads != 1 or g is None
                      or g.dim() != 4):
        raise ValueError("build_delta_launches: key_decay takes wy=False, no ssd, g [B, T, HV, K], and a shape "
                         f"with phases = prep_heads = 1 (got phases={shape.phases}, prep_heads={shape.prep_heads})")
    if not wy and (num_householder != 1 or use_qk_l2norm_in_kernel or beta is not None or keep_prep
                   or checkpoint_chunks or expanded_chunk_states):
        raise ValueError("build_delta_launches: wy=False takes M = 1, no l2norm, no beta, forward only")
    if ssd is not None and wy:
        raise ValueError("build_delta_launches: ssd needs wy=False")
    group = shape.group_prep
    if group and (wy or key_decay or num_householder != 1):
        raise ValueError("DeltaShape.group_prep: the group prep takes a scalar decay with wy=False and M = 1")
    if shape.calm_gates and not group:
        raise ValueError("DeltaShape.calm_gates: the calm gates need group_prep=True")
    if shape.sweep_scores and not (group and not shape.calm_gates):
        raise ValueError("DeltaShape.sweep_scores: the scores formed in the sweep need group_prep=True and "
                         f"calm_gates=False (got group_prep={group}, calm_gates={shape.calm_gates})")
    # specialized refines gluon_sweep (the twin warp-specialised) and means nothing without it
    if shape.specialized and shape.gluon_sweep and not ((group or wy) and shape.segments == 1):
        raise ValueError("DeltaShape.specialized: the warp-specialised sweep needs the WY step or group_prep, and one "
                         f"pass or phases (got wy={wy}, group_prep={group}, segments={shape.segments})")
    heads = 1 if group else shape.prep_heads
    if heads > 1 and (wy or (v.shape[2] // q.shape[2]) % heads != 0):
        raise ValueError(f"DeltaShape.prep_heads: {heads} value heads a prep program needs wy=False and a divisor "
                         f"of HV / H = {v.shape[2] // q.shape[2]}")
    M = num_householder
    block_v, num_warps, num_stages, prep_warps = shape.block_v, shape.num_warps, shape.num_stages, shape.prep_warps
    segments, v_product, tma_store, phases = shape.segments, shape.v_product, shape.tma_store, shape.phases
    prep_maxnreg = shape.prep_maxnreg
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else float(scale)
    device = q.device
    varlen = cu_seqlens is not None
    N = cu_seqlens.shape[0] - 1 if varlen else B
    BT = CHUNK_SIZE
    BK = max(16, triton.next_power_of_2(K))
    BV = min(block_v, max(16, triton.next_power_of_2(V)))
    if varlen:
        if chunk_indices_dp is None:
            raise ValueError("chunk_delta_fwd: varlen input needs chunk_indices_dp (recurscan.descriptors)")
        n_prep = chunk_indices_dp.shape[0]
    else:
        n_prep = B * triton.cdiv(T * M, BT)
    use_cache = state is not None
    store_final = not use_cache and output_final_state
    if shape.fused and not INTERPRET and wy and M == 1 and ssd is None and use_qk_l2norm_in_kernel \
            and not (key_decay or group or return_chunk_states or keep_prep or checkpoint_chunks or states_only) \
            and fused_call_ok(q, k, v, g, beta, state, out_views, N):
        return _fused_launches(q, v, g, beta, scale, initial_state, state, store_final, out_views, N, n_prep, varlen)

    buffers = {"o": ((B, T, HV, V), v.dtype if ssd is not None else q.dtype, None)}
    if group and not shape.sweep_scores:  # the scores once per query/key head, gated per value head in the sweep
        buffers["scores"] = ((B, T, H, BT), (q.dtype if shape.calm_gates else torch.float32), None)
    else:
        buffers["aqk"] = ((B, T * M, HV, BT), q.dtype, None)
    if wy:
        buffers["wy"] = ((B, T * M, HV, BT), q.dtype, None)
    # per (chunk slot, head): slots (bos + 64 c) // 64 + n < B*T*M // 64 + N (_chunk_slot)
    coef_width = GROUP_COEF_WIDTH.value if group else 4
    buffers["coef"] = (((B * T * M) // BT + N, HV, BT, coef_width), torch.float32, None)
    if varlen and N > 0:  # the sweep's order of sequences, longest first (written by the prep)
        buffers["sequence_order"] = ((N,), torch.int32, None)
    if beta is None and wy:
        buffers["beta_ones"] = ((B, T * M, HV), q.dtype, 1.0)
    if store_final:
        buffers["final"] = ((N, HV, K, V), torch.float32, None)
    if return_chunk_states:
        if varlen:
            if chunk_offsets is None or num_chunk_rows is None:
                raise ValueError("chunk_delta_fwd: chunk states of varlen input need chunk_offsets and num_chunk_rows")
            rows = num_chunk_rows
        else:
            rows = B * triton.cdiv(T * (M if expanded_chunk_states else 1), BT)
        # Zeros: rows past the last sequence's (descriptor padding) and a padding sequence's rows.
        buffers["chunk_states"] = ((rows, HV, K, V), chunk_states_dtype, 0.0)

    if checkpoint_chunks:
        if varlen:
            raise ValueError("chunk_delta_fwd: checkpoint_chunks takes a dense batch")
        buffers["checkpoints"] = ((B, triton.cdiv(triton.cdiv(T, BT), checkpoint_chunks), HV, K, V), torch.float32,
                                  None)

    def arg(name, present=True):  # a per-call tensor; an absent one points at o (its flag keeps it unread)
        return CallArg(name if present else "o")

    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"
    dt = product_dtype(q.dtype)
    beta_arg = arg("beta") if beta is not None else arg("beta_ones", wy)
    clamps = ssd is not None and tuple(ssd.dt_limit) != (0.0, float("inf"))
    has_d = ssd is not None and ssd.D is not None
    ssd_prep = dict(dt=arg("dt", ssd is not None), A=arg("A", ssd is not None),
                    dt_bias=arg("dt_bias", ssd is not None and ssd.dt_bias is not None),
                    dt_min=float(ssd.dt_limit[0]) if clamps else 0.0, dt_max=float(ssd.dt_limit[1]) if clamps else 0.0,
                    WY=wy, SSD=ssd is not None, HAS_DT_BIAS=ssd is not None and ssd.dt_bias is not None,
                    DT_SOFTPLUS=ssd is not None and bool(ssd.dt_softplus), DT_LIMIT=clamps)
    ssd_sweep = dict(D=arg("D", has_d), z=arg("z", ssd is not None and ssd.z is not None), WY=wy, HAS_D=has_d,
                     D_PER_CHANNEL=has_d and ssd.D.dim() == 2, HAS_Z=ssd is not None and ssd.z is not None)
    steps = []
    NTe = triton.cdiv(T * M, BT)  # expanded chunks of a dense sequence
    prep = dict(
        q=arg("q"), k=arg("k"), g=arg("g", g is not None), beta=beta_arg, wy=arg("wy", wy), aqk=arg("aqk"),
        coef=arg("coef"), winv=arg("winv", keep_prep), ready_flags=arg("ready", False),
        cu_seqlens=arg("cu_seqlens", varlen), chunk_indices=arg("chunk_indices_dp", varlen),
        sequence_order=arg("sequence_order", varlen and N > 0), scale=scale, T=T, n_seq=N if varlen else 0,
        chunk_lo=0, chunk_span=0 if varlen else NTe,
        H=H, HV=HV, K=K, M=M, BT=BT, BK=BK,
        USE_L2NORM=use_qk_l2norm_in_kernel, IS_VARLEN=varlen, HAS_G=g is not None,
        INV_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", DT=dt, INV_FP16=q.dtype != torch.float32,
        INV_SPLIT=plan_delta.PREP_SPLIT_INVERSE if q.dtype != torch.float32 else 0, wait_primary=0,
        trigger_dependents=0, PDL=not INTERPRET,
        STORE_INV=keep_prep, HEADS=heads, QUERY=2, READY=False, **ssd_prep)
    prep_kernel, prep_per_chunk = chunk_delta_prep_kernel, HV // heads
    if group:
        # a program per (chunk, query/key head, block of HB value heads)
        prep_per_chunk, group_heads = _group_prep_blocks(H, HV, not shape.sweep_scores, shape.group_prep_heads)
        prep_kernel = chunk_group_prep_kernel
        prep = dict({n: prep[n] for n in ("q", "k", "g", "coef", "cu_seqlens", "chunk_indices", "sequence_order",
                                          "dt", "A", "dt_bias", "scale", "T", "n_seq", "chunk_lo", "chunk_span",
                                          "wait_primary", "dt_min", "dt_max", "H", "HV", "K", "BT", "BK",
                                          "IS_VARLEN", "HAS_G", "DT", "PDL", "SSD", "HAS_DT_BIAS", "DT_SOFTPLUS",
                                          "DT_LIMIT")},
                    scores=arg("scores"), HB=group_heads, PRECISION=dot_precision,
                    SCORES=not shape.sweep_scores, CALM_GATES=shape.calm_gates)
    # The initial state's source (the cache, or initial_state) is read and written through its strides.
    s0 = state.stride() if use_cache else initial_state.stride() if initial_state is not None else (0, 0, 0, 0)
    o_strides, ht_strides = (HV * V, V), (HV * K * V, K * V)  # the buffers' own layouts
    if out_views is not None:
        o_view, final_view = out_views
        o_strides, ht_strides = check_out_views(o_view, final_view, (B, T, HV, V), (N, HV, K, V),
                                                buffers["o"][1], store_final)
    # Bulk stores need 16-byte strides and a 16-byte aligned base (a view's alignment is in the signature's key).
    tma_ok = all(x * buffers["o"][1].itemsize % 16 == 0 for x in (V,) + o_strides) and \
        (out_views is None or out_views[0].data_ptr() % 16 == 0)
    sweep_kernel, sweep_options = _sweep_kernel(
        shape, q, k, v, BV, tma_ok, wy=wy, ssd=ssd, key_decay=key_decay, M=M,
        chunk_state_rows=buffers["chunk_states"][0][0] if return_chunk_states else 0, state_strides=s0,
        states_only=states_only, chunk_states_dtype=chunk_states_dtype, checkpoints=checkpoint_chunks > 0)
    specialised = sweep_kernel.__name__ == "gluon_gla_sweep_specialized_kernel"
    # The chained schedule where the warp-specialised sweep runs the call (under the interpreter, the
    # Triton sweep after the whole prep: the same bits); a call it cannot take runs the phases.
    chained = shape.chained and not varlen and segments <= 1 and T > 0 and wy and M == 1 and ssd is None \
        and not (checkpoint_chunks or states_only) and (specialised or INTERPRET)
    phased = phases > 1 and not varlen and segments <= 1 and T > 0 and not chained
    # A register cap (compile option) sets how many prep programs share a multiprocessor.
    prep_options = dict(num_warps=prep_warps, **({} if prep_maxnreg is None else {"maxnreg": prep_maxnreg}))
    if key_decay:  # the per-key prep in the delta prep's place (phases: refused above)
        slots = buffers["coef"][0][0]
        buffers.update(qg=((B, T, HV, K), q.dtype, None), kg=((B, T, HV, K), q.dtype, None),
                       dl=((slots, HV, K), torch.float32, None))
        prep = dict(
            q=arg("q"), k=arg("k"), g=arg("g"), qg=arg("qg"), kg=arg("kg"), aqk=arg("aqk"), dl=arg("dl"),
            cu_seqlens=arg("cu_seqlens", varlen), chunk_indices=arg("chunk_indices_dp", varlen),
            chunk_offsets=arg("cu_seqlens", varlen),  # read, then replaced by the sweep's slot (FOR_SWEEP)
            dt=arg("o"), A=arg("o"), dt_bias=arg("o"), T=T, n_seq=N, scale=scale, n_cs_rows=slots, dt_min=0.0,
            dt_max=0.0, coef=arg("coef"), sequence_order=arg("sequence_order", varlen and N > 0),
            H=H, HV=HV, K=K, BT=BT, BK=BK, IS_VARLEN=varlen, DT=dt, DOT_PRECISION=dot_precision, HAS_G=True,
            SCALAR=False, SSD=False, HAS_DT_BIAS=False, DT_SOFTPLUS=False, DT_LIMIT=False, FOR_SWEEP=True,
            BKB=min(shape.prep_key_block, BK))
        calm = (shape.prep_key_block, shape.prep_warps, shape.prep_maxnreg) if shape.key_calm_pass else None
        if n_prep > 0:
            if calm is not None:
                buffers["calm_flags"] = ((n_prep * HV,), torch.int8, None)
            steps += per_key_prep_steps(prep, (n_prep * HV,), calm, BK, prep_options, arg("calm_flags"))
    elif n_prep > 0 and not (phased or chained):
        steps.append(Step(prep_kernel, (n_prep * prep_per_chunk,), prep, prep_options))
    outputs = ("o", "state" if use_cache else ("final" if store_final else None)) + \
        (("chunk_states",) if return_chunk_states else ()) + (kept_prep_names(varlen and N > 0) if keep_prep else ()) + \
        (("checkpoints",) if checkpoint_chunks else ())
    if keep_prep:
        buffers["winv"] = buffers["wy"]
    NV = triton.cdiv(V, BV)
    if chained:  # a (chunk slot, value head)'s prep is done (as coef's slots), zero before each call
        buffers["ready"] = (buffers["coef"][0][:2], torch.int32, 0)
    P, seg_chunks = 1, 0
    if segments > 1 and varlen and T > 0:  # each sequence cut by its own length (the sweep kernel)
        P = segments
    elif segments > 1 and T > 0:
        seg_chunks = triton.cdiv(triton.cdiv(T, BT), segments)
        P = triton.cdiv(triton.cdiv(T, BT), seg_chunks)  # no empty segment
    sweep = dict(
        q=arg("qg" if key_decay else "q"), k=arg("kg" if key_decay else "k"), v=arg("v"), wy=arg("wy", wy),
        aqk=arg("scores", not shape.sweep_scores) if group else arg("aqk"), coef=arg("coef"), o=arg("o"),
        h0=arg("initial_state", initial_state is not None), ht=arg("final", store_final),
        state=arg("state", use_cache), state_indices=arg("state_indices", use_cache),
        chunk_states=arg("chunk_states", return_chunk_states), cu_seqlens=arg("cu_seqlens", varlen),
        chunk_offsets=arg("chunk_offsets", varlen and return_chunk_states),
        sequence_order=arg("sequence_order", varlen and N > 0),
        seg_n=arg("o"), seg_m=arg("o"), n_seg=1, seg_chunks=0, tc_first=0, tc_count=0, trigger_dependents=0, T=T,
        s0_n=s0[0], s0_h=s0[1], s0_k=s0[2], s0_v=s0[3], n_slots=state.shape[0] if use_cache else 0,
        n_cs_rows=buffers["chunk_states"][0][0] if return_chunk_states else 0, replay_flags=arg("replay_flags"),
        u_out=arg("u", False), ks_out=arg("ks", False), checkpoints=arg("checkpoints", checkpoint_chunks > 0),
        n_ckpt=buffers["checkpoints"][0][1] if checkpoint_chunks else 0,
        dl=arg("dl", key_decay), KEY_DECAY=key_decay, o_st=o_strides[0], o_sh=o_strides[1], ht_n=ht_strides[0],
        ht_h=ht_strides[1], ready_flags=arg("ready", chained),
        H=HV if key_decay else H, HV=HV, K=K, V=V, M=M, BT=BT, BK=BK, BV=BV,
        IS_VARLEN=varlen, HAS_H0=initial_state is not None, USE_CACHE=use_cache, STORE_FINAL=store_final,
        STORE_CHUNK_STATES=(2 if expanded_chunk_states else True) if return_chunk_states else False,
        DOT_PRECISION=dot_precision, NUM_STAGES=num_stages, DT=dt, PASS=0,
        V_PRODUCT=v_product, TMA_STORE=tma_store and M == 1 and tma_ok and not states_only,
        PDL=not INTERPRET, REPLAY=False, OUTPUTS=not states_only, STORE_U=False, CKPT_CHUNKS=checkpoint_chunks,
        GATE_SCORES=group, CALM_GATES=shape.calm_gates and not states_only, SWEEP_SCORES=shape.sweep_scores,
        **ssd_sweep, **({"CHAINED": chained} if specialised else {}))
    options = dict(num_warps=num_warps, **sweep_options)
    chained_step = -1
    if chained:
        # The sweep first, triggering at its start; the prep its programmatic dependent on the SMs the
        # sweep leaves free (its last program waiting for the sweep, as a phase's prep does), each
        # program raising its chunk's ready flag, on which the sweep's load warp waits (run_delta_
        # launches puts the prep first where the launch cannot be programmatic). The prep goes
        # chunk-major across sequences, as the sweeps read it. The lead's chunks (shape.chained_lead)
        # are prepared before, on every SM, each of its programs letting the sweep launch as it starts.
        ready = dict(prep, ready_flags=arg("ready"), READY=True, n_seq=N)
        lead = min(round(NTe * shape.chained_lead), NTe - 1)
        if lead > 0:
            steps.append(Step(prep_kernel, (N * lead * prep_per_chunk,),
                              dict(ready, chunk_span=lead, trigger_dependents=1), prep_options))
        chained_step = len(steps)
        steps.append(Step(sweep_kernel, (N * HV * NV,), dict(sweep, trigger_dependents=1), options,
                          programmatic=lead > 0))
        steps.append(Step(prep_kernel, (N * (NTe - lead) * prep_per_chunk,),
                          dict(ready, chunk_lo=lead, chunk_span=NTe - lead, wait_primary=1),
                          prep_options, programmatic=True, min_shared=PREP_SHARED_BESIDE_SWEEP))
        replay = (N * HV * NV,), sweep
    elif phased:
        # prep 0, sweep 0, prep 1, sweep 1, ...: each prep after the first is the programmatic
        # dependent of the sweep before it, so it runs on the SMs that sweep leaves free.
        buffers["seg_n"] = ((N, HV, K, V), torch.float32, None)  # the state between phases
        bounds = phase_bounds(triton.cdiv(T, BT), phases, shape.phase_ratio)
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            c_lo, c_hi = lo * M, min(hi * M, NTe)
            steps.append(Step(prep_kernel, (N * (c_hi - c_lo) * prep_per_chunk,),
                               dict(prep, chunk_lo=c_lo, chunk_span=c_hi - c_lo, wait_primary=int(i > 0)),
                               prep_options, programmatic=i > 0, min_shared=PREP_SHARED_BESIDE_SWEEP))
            # The sweep after its prep's end (a programmatic dependent of the prep was no faster).
            steps.append(Step(sweep_kernel, (N * HV * NV,),
                               dict(sweep, seg_n=arg("seg_n"), tc_first=lo, tc_count=hi - lo, PASS=3,
                                    trigger_dependents=int(i < len(bounds) - 2)), options))
        replay = (N * HV * NV,), sweep  # the whole sequence again: the phases' bits are the single pass's
    elif P == 1:
        steps.append(Step(sweep_kernel, (N * HV * NV,), sweep, options))
        replay = (N * HV * NV,), sweep
    else:
        # Pass 1: segment end states from zero (segment 0: from the initial state) and the
        # transitions M_i (identity state, no values); fix-up S_in[i+1] = M_i S_in[i] + N_i;
        # pass 2: every segment's outputs from its S_in.
        buffers["seg_n"] = ((N, P, HV, K, V), torch.float32, None)
        if P > 2:
            buffers["seg_m"] = ((N, P, HV, K, K), torch.float32, None)
        seg = dict(seg_n=arg("seg_n"), seg_m=arg("seg_m") if P > 2 else arg("seg_n"), n_seg=P, seg_chunks=seg_chunks)
        NK = triton.cdiv(K, BV)
        steps.append(Step(chunk_delta_sweep_kernel, (N * (P - 1) * HV * (NV + NK),),
                           dict(sweep, **seg, STORE_FINAL=False, STORE_CHUNK_STATES=False, PASS=1), options))
        if P > 2:
            BVF = min(32, max(16, triton.next_power_of_2(V)))
            steps.append(Step(chunk_delta_fixup_kernel, (N * HV * triton.cdiv(V, BVF),), dict(
                seg_n=arg("seg_n"), seg_m=arg("seg_m"), state_indices=arg("state_indices", use_cache), n_seg=P,
                n_slots=state.shape[0] if use_cache else 0,
                HV=HV, K=K, V=V, BK=BK, BV=BVF, USE_CACHE=use_cache,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32x3"), dict(num_warps=8)))
        steps.append(Step(sweep_kernel, (N * P * HV * NV,), dict(sweep, **seg, PASS=2), options))
        replay = (N * P * HV * NV,), dict(sweep, **seg, PASS=2)
    if N * HV * NV > 0:
        grid, kwargs = replay
        buffers["replay_flags"] = (grid, torch.int32, None)  # raised by a sweep program whose state is non-finite
        if not states_only:
            # Those programs again (their flags, their outputs only): a programmatic dependent of the
            # last sweep, whose programs wait for it and mostly just exit.
            kwargs = {n: a for n, a in kwargs.items() if n != "CHAINED"}  # the Triton kernel's arguments
            steps.append(Step(chunk_delta_sweep_kernel, grid, dict(kwargs, REPLAY=True, NUM_STAGES=1),
                              dict(num_warps=num_warps), programmatic=True))
    return DeltaLaunches(buffers, steps, outputs, device, chained=chained_step)


def _fused_launches(q, v, g, beta, scale, initial_state, state, store_final, out_views, N, n_prep,
                    varlen) -> DeltaLaunches:
    """The fused prefill's launches (``DeltaShape.fused``; launch/delta_fused.py) for a call it takes."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    buffers = {"o": ((B, T, HV, V), q.dtype, None)}
    if store_final:
        buffers["final"] = ((N, HV, K, V), torch.float32, None)
    if beta is None:
        buffers["beta_ones"] = ((B, T, HV), q.dtype, 1.0)
    o_strides, ht_strides = (HV * V, V), (HV * K * V, K * V)
    if out_views is not None:
        o_strides, ht_strides = check_out_views(*out_views, (B, T, HV, V), (N, HV, K, V), q.dtype, store_final)
    source = state if state is not None else initial_state
    s0 = source.stride() if source is not None else (0, 0, 0, 0)
    more, steps = fused_launch_steps(Step, q, v, H=H, HV=HV, K=K, V=V, N=N, T=T, scale=scale, varlen=varlen,
                                     n_prep=n_prep, has_g=g is not None, has_h0=initial_state is not None,
                                     store_final=store_final, s0=s0, o_strides=o_strides, ht_strides=ht_strides,
                                     beta_name="beta" if beta is not None else "beta_ones",
                                     n_slots=state.shape[0] if state is not None else 0)
    buffers.update(more)
    final = "state" if state is not None else "final" if store_final else None
    return DeltaLaunches(buffers, steps, ("o", final), q.device)


def is_sweep_step(step: Step) -> bool:
    """Whether a launch record is a sweep's (the Triton kernel's or its Gluon twin's: the two take
    the same arguments, REPLAY among them)."""
    return "REPLAY" in step.kwargs


def _sweep_kernel(shape: DeltaShape, q, k, v, BV: int, tma_ok: bool, *, wy, ssd, key_decay, M, chunk_state_rows,
                  state_strides, states_only=False, chunk_states_dtype=torch.float32, checkpoints=False):
    """The kernel of the sweep's single pass, phases and second passes: the Triton kernel, or with
    ``shape.gluon_sweep`` its Gluon twin (kernels/gluon/delta_sweep.py; a pass 1 and the replay stay
    Triton's, the same arithmetic). A shape the twin cannot take is a ValueError (the planner's
    never is); a call it cannot take (q, k or v not 16-byte aligned, outputs the bulk stores cannot
    take, chunk-state rows past int32 coordinates, an initial state or cache whose offsets within a
    slot pass int32, SSD's gate z) runs the Triton kernel. The calm gates only with ``states_only``
    (no outputs, so nothing of theirs is read); ``shape.sweep_scores`` (the scores formed in the
    sweep) on the warp-specialised kernel or the Triton kernel, not the twin; chunk states on the
    warp-specialised kernel only in the inputs' dtype (its hand-over buffer's), else on the twin or,
    with ``sweep_scores``, the Triton kernel; ``checkpoints`` (the training forward's) on the twin.
    The backward's recompute (launch/delta_backward.py) builds the forward with outputs and turns
    them into STORE_U, which the warp-specialised kernel takes with WY.
    Returns ``(kernel, launch options beyond num_warps)``: the warp-specialised sweep's partitions
    share the register file under one cap."""
    if not shape.gluon_sweep:
        return chunk_delta_sweep_kernel, {}
    from ..plan.delta import gluon_sweep_scope
    K, V = q.shape[3], v.shape[3]
    if not ((shape.v_product or not wy) and not key_decay and not (shape.group_prep and wy)
            and not (shape.calm_gates and not states_only)
            and BV == 64 and shape.num_warps == 4
            and gluon_sweep_scope(householder=M, dtype=q.dtype, key_dim=K, value_dim=V)):
        raise ValueError("DeltaShape.gluon_sweep: the Gluon sweep takes the delta rule with v_product, or a scalar "
                         "decay with the WY step off (GLA, SSD; the delta prep or the group prep without its calm "
                         "gates), no decay per key; M = 1, 16-bit inputs, K 64 or 128, V a multiple of 64, block_v = "
                         f"64 on 4 warps (got M = {M}, {q.dtype}, K = {K}, V = {V}, BV = {BV}, num_warps = "
                         f"{shape.num_warps}, v_product = {shape.v_product}, WY {'on' if wy else 'off'}, calm gates "
                         f"{shape.calm_gates})")
    aligned = all(not x.is_contiguous() or x.data_ptr() % 16 == 0 for x in (q, k, v))
    in_slot = (K - 1) * state_strides[2] + (V - 1) * state_strides[3]
    # A chunk-state row out of range is moved to row chunk_state_rows, whose coordinates must fit too.
    if not (aligned and tma_ok and (chunk_state_rows + 1) * v.shape[2] * K < 2 ** 31 and in_slot < 2 ** 31) or \
            (ssd is not None and ssd.z is not None):
        return chunk_delta_sweep_kernel, {}
    if shape.specialized and not states_only and not checkpoints and \
            (chunk_state_rows == 0 or chunk_states_dtype == q.dtype):
        from ..kernels.gluon.gla_sweep_specialized import gluon_gla_sweep_specialized_kernel
        return gluon_gla_sweep_specialized_kernel, {"maxnreg": SPECIALIZED_MAXNREG}
    if shape.sweep_scores and not states_only:  # the twin reads the prep's scores
        return chunk_delta_sweep_kernel, {}
    from ..kernels.gluon.delta_sweep import gluon_sweep_kernel
    return gluon_sweep_kernel, {}


#: Registers a thread under the warp-specialised sweep's cap: its chain, two outputs warpgroups and
#: the load warp launch as 16 warps (the load warp padded to its warpgroup), 512 threads x 128
#: within the 64 K registers of an SM; setmaxnreg then moves them between the partitions
#: (kernels/gluon/gla_sweep_specialized.py's OUTPUT_REGS and LOAD_REGS, the chain the rest).
SPECIALIZED_MAXNREG = 128


def check_out_views(o, final, o_shape, final_shape, dtype, store_final) -> tuple:
    """``((token stride, head stride) of o, (sequence stride, head stride) of final)`` for
    :func:`build_delta_launches`' ``out_views``, or a ValueError saying which view the sweep cannot
    write through."""
    B, T, HV, V = o_shape
    if tuple(o.shape) != o_shape or o.dtype != dtype or o.stride(3) != 1 or (B > 1 and o.stride(0) != T * o.stride(1)):
        raise ValueError(f"out_views: o must be {o_shape} in {dtype} with a unit last stride and batch stride T x "
                         f"its token stride, got {tuple(o.shape)} {o.dtype} strides {o.stride()}")
    if not store_final or tuple(final.shape) != final_shape or final.dtype != torch.float32 or \
            final.stride()[2:] != (V, 1):
        raise ValueError(f"out_views: final must be {final_shape} float32 with rows of V = {V} (and the call must "
                         f"return its final state), got {tuple(final.shape)} {final.dtype} strides {final.stride()}")
    return (o.stride(1), o.stride(2)), (final.stride(0), final.stride(1))


#: Shared memory a phased prep program reserves, at least: a prep program beside a sweep program
#: slows the sweep's chain more than it adds, and 48 KB does not fit beside the phased sweep's
#: 182.5 KB (228 KB a multiprocessor on the H200, 1 KB of it reserved per program), while three
#: still fit where no sweep runs. 48 KB is also the most a launch may ask for without opt-in.
PREP_SHARED_BESIDE_SWEEP = 48 * 1024


#: Each phase of the phased sweep is this fraction of the one before (phase_bounds): the prep of
#: phase i + 1 runs beside the sweep of phase i on the SMs it leaves free, so it covers fewer chunks
#: in that time than the sweep does (docs/perf-history.md has the measurement).
PHASE_RATIO = 0.9


def phase_bounds(n_chunks: int, phases: int, ratio: float | None = None) -> list[int]:
    """Token-chunk boundaries ``[0, b_1, ..., n_chunks]`` of ``phases`` phases (fewer if there are
    fewer chunks) whose lengths fall geometrically by ``ratio``, each at least one chunk.

    >>> phase_bounds(256, 4)
    [0, 74, 141, 202, 256]
    >>> phase_bounds(2, 4)
    [0, 1, 2]
    """
    ratio = PHASE_RATIO if ratio is None else ratio
    phases = max(1, min(phases, n_chunks))
    weights = [ratio ** i for i in range(phases)]
    total = sum(weights)
    bounds, acc = [0], 0.0
    for i, w in enumerate(weights[:-1]):
        acc += w
        bounds.append(min(max(round(n_chunks * acc / total), bounds[-1] + 1), n_chunks - (phases - 1 - i)))
    bounds.append(n_chunks)
    return bounds


def run_delta_launches(launches: DeltaLaunches, inputs: "DeltaInputs", given: dict | None = None,
                       steps: slice = slice(None)) -> tuple:
    """Allocate the buffers and launch the steps on ``inputs`` (tensors or None, in the order of
    :class:`DeltaInputs`, trailing ones may be left out; they must have the signature the launches
    were built for). ``given``: buffers by name that a caller already holds (the backward's
    recompute takes the prep's outputs the forward kept), used instead of new ones. ``steps``: the
    launches to make (all; a caller that runs the rest on another stream passes each part, with
    every buffer in ``given``). The first run launches through Triton's JIT; later ones launch the
    compiled kernels directly."""
    q, k, v, g, beta = inputs[:5]
    # A plain tuple may stop before DeltaInputs' last fields (the SSD ones): they are None.
    inputs = (q.contiguous(), k.contiguous(), v.contiguous(), g if g is None else g.contiguous(),
              beta if beta is None else beta.contiguous()) + tuple(inputs[5:]) + \
        (None,) * (len(INPUT_NAMES) - len(inputs))
    made = allocate_buffers(launches, given)
    values = inputs + tuple(made.get(n) for n in BUFFER_NAMES)
    chosen = launches.steps[steps]
    if launches.chained >= 0 and steps == slice(None):
        chosen = _chained_order(chosen, launches.chained)
    if launches.launched or INTERPRET:
        launch_steps(chosen, values)
    else:  # the first call: every kernel compiles at once
        with compile_together([(s.kernel, s.grid, s.kwargs, s.options) for s in chosen], CALL_NAMES, values):
            launch_steps(chosen, values)
        launches.launched = steps.stop is None
    return tuple(None if i is None else values[i] for i in launches.outputs)


def _chained_order(steps: list, i: int) -> list:
    """The chained schedule's launches in the order they can run: the sweep (step ``i``) before its
    prep where both launch directly and the prep as its programmatic dependent, so that the prep runs
    beside it; otherwise (a first call through the JIT, the interpreter, a profiler's launch hook,
    CUDA_LAUNCH_BLOCKING) the prep first, one after the other: a plain launch of the prep after the
    sweep would wait for the sweep's end, and the sweep for the prep's flags (until its waits ran out
    and the replay launch redid its programs: correct, ~100 ms late)."""
    if not INTERPRET and not _LAUNCH_BLOCKING and launches_programmatically(steps[i].direct, steps[i + 1].direct):
        return steps
    return steps[:i] + [steps[i + 1], steps[i]] + steps[i + 2:]


#: CUDA runs every launch to its end before the next (a debugging setting, read at CUDA's start).
_LAUNCH_BLOCKING = os.environ.get("CUDA_LAUNCH_BLOCKING", "0") == "1"


def allocate_buffers(launches: DeltaLaunches, given: dict | None = None) -> dict:
    """Every buffer of ``launches`` by name: those in ``given`` as given, the rest new (on the
    current stream)."""
    made = dict(given or {})
    for name, (shape, dtype, fill) in launches.buffers.items():
        if name not in made:
            made[name] = _empty(*shape, dtype=dtype, device=launches.device) if fill is None else \
                torch.full(shape, fill, dtype=dtype, device=launches.device)
    return made


def launch_steps(steps: list, values: tuple, names: tuple = CALL_NAMES) -> None:
    """Launch ``steps`` in order on ``values`` (the per-call tensors in the order of ``names``):
    each through its compiled kernel's direct launch, or on its first call (or where the direct
    path does not take it) through Triton's JIT, which compiles it and returns its direct launch."""
    for step in steps:
        if step.direct is not None:
            step.direct(values)
        else:
            step.direct = jit_launch(step.kernel, step.grid, step.kwargs, step.options, names, values,
                                     step.programmatic, step.min_shared)


#: The launch shape :func:`chunk_delta_fwd` takes where none is given: narrow tiles, no register cap.
TEST_SHAPE = DeltaShape(32, 4, 2, 4, "chunk_delta_fwd's default (tests)", prep_maxnreg=None)


def chunk_delta_fwd(q, k, v, g, beta, *, num_householder=1, scale=None, initial_state=None,
                    output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                    chunk_indices_dp=None, chunk_offsets=None, num_chunk_rows=None, state=None,
                    state_indices=None, return_chunk_states=False, shape: DeltaShape | None = None, **fields):
    """Build and run the launches in one go (the public ops keep the launches of each call
    signature and only run them). Arguments as the public ops (``recurscan.chunk_gated_delta_rule``,
    ``recurscan.chunk_gated_delta_product_varlen``), with the descriptors already built:

    - varlen (``cu_seqlens`` given): ``chunk_indices_dp [NT_pad, 2]`` (sequence, chunk) of the
      expanded stream sizes the prep grid; with ``return_chunk_states``, ``chunk_offsets [N + 1]``
      and ``num_chunk_rows`` (rows of the chunk-state tensor, >= chunk_offsets[N]) too.
    - ``shape``: the launch shape (:class:`recurscan.plan.DeltaShape`; the planner's choice in the
      ops), default :data:`TEST_SHAPE`; ``fields`` replace single fields of it, e.g.
      ``block_v=64, segments=3``. Segments cut every sequence into that many parts (varlen: each
      by its own length); phases apply to dense single-pass batches. The phases overlap only
      through programmatic launches, which kept launches make from their second run on: here
      every call builds anew, so its launches go through Triton's JIT and the phases run one
      after another (same bits).

    Reads no device value on the host and sizes nothing from data: capturable in a CUDA graph.
    Scratch: ``wy`` and ``aqk`` (``[B, T*M, HV, 64]`` in the input dtype) and the per-row
    coefficients (``coef [B*T*M // 64 + N, HV, 64, 4]`` float32, by chunk), all written by the prep
    kernel before the sweep reads them; with segments, ``[B, P, HV, K, V]`` and ``[B, P, HV, K, K]``
    float32 (segment states, transitions).
    Returns ``(o, final_state or None[, chunk_states])``; with a cache, the final state is ``state``.
    """
    import dataclasses
    shape = dataclasses.replace(shape or TEST_SHAPE, **fields)
    launches = build_delta_launches(
        q, k, v, g, beta, shape, num_householder=num_householder, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens, chunk_indices_dp=chunk_indices_dp, chunk_offsets=chunk_offsets,
        num_chunk_rows=num_chunk_rows, state=state, state_indices=state_indices,
        return_chunk_states=return_chunk_states)
    return run_delta_launches(launches, DeltaInputs(q, k, v, g, beta, initial_state, state, state_indices,
                                                    cu_seqlens, chunk_indices_dp, chunk_offsets))
