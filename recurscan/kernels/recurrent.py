"""The streaming recurrence: one Triton kernel for every family, token by token (seed 000).

Schedule (seed 000, docs/kernels-decode.md)
-------------------------------------------
* A program per (sequence, value head, column block of BV state columns), flattened into grid
  axis x (no 65535 cap on y/z). The program holds its ``[BK, BV]`` tile of the state in registers
  for the whole run: each state column stays with the program that owns it from the first token to
  the last, and the state is read once and written once per launch.
* The loop over tokens is a runtime loop (``for t in range(t_begin, t_stop)``), so the compiled
  kernel is the same at every length: decode (T = 1), speculative decode (T = drafts * steps) and
  a whole prompt (streaming prefill, time linear in T).
* The rows of a column are spread over the lanes of the program: the key reductions of the delta
  rule (``S^T k``) and of the read (``S^T q``) are partial sums per lane, summed across lanes every
  token. How many columns a program owns (BV) and how many warps share them is a rule on the
  shape (:func:`stream_config`): many requests get wide 16 KB tiles (bandwidth), a long delta-rule
  sequence over too few heads gets narrow tiles so that more programs run and each column's rows
  are split over more lanes (latency).
* A launch that would run more steps than the device's bound on one dispatch
  (:data:`DISPATCH_STEP_BOUND`) is split into launches over token ranges that hand the state on
  through a float32 buffer.
* A state column that cannot stay on chip (``K`` rows beyond :data:`MAX_COLUMN_BYTES`) is refused
  before launch with :class:`StateColumnTooLarge` (a ValueError that says so).

Families are constexpr flags on one kernel (never copies):

=========================  =======  =====================================  ======================
family                     DELTA    GATE (decay before the write)          BETA (write strength)
=========================  =======  =====================================  ======================
Gated DeltaNet (GDN)       1        1: scalar log decay g [B, T, HV]       0 / 1 per head / 2 per
                                                                           value column
GDP (folded, seed 002)     1        1 (the decay on each token's 1st copy) as GDN
GDN with per-key decay     1        2: log decay per key gk [B, T, HV, K]  as GDN
GLA, scalar decay          0        1                                       0
GLA, per-key decay         0        2                                       0
Mamba2 SSD                 0        3: exp(A * dt), dt = softplus(dt +      dt (per head, or per
                                    dt_bias); A per head or per element     value column)
=========================  =======  =====================================  ======================

Per token, in one pass over the tile held in registers::

    S <- decay * S
    DELTA:  u = beta * (v - S^T k)                           else:  u = beta * v
    S <- S + k u^T
    o = scale * S^T q   (+ D * x, * silu(z) for SSD)

(one token, decode: ``o = scale * (S^T q + (k . q) u)`` from the decayed tile, beside the S^T k
reduction, so the program's chain has no pass over the updated tile).

State caches: ``slots [N]`` maps sequence n to its cache row (-1: padding, output zero, the
state is neither read nor written); pool offsets are 64-bit. Snapshots for speculative decoding
are stored at the request's slot every ``STEPS`` steps, from registers (one store per draft token,
no re-read); ``accepted [N]`` starts a request from its snapshot ``accepted[n] - 1`` (0: from the
cache row). Any state dtype is accumulated in float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import key_contiguous, launch_key
from ..plan import sm_count
from ._launch import CallArg, jit_launch, resolve

# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------


@triton.jit
def _softplus(x):
    # torch's softplus with threshold 20 (mamba's kernels): linear above 20; log1p(exp(x)) below,
    # written so that it keeps its relative precision where exp(x) is tiny.
    e = tl.exp(tl.minimum(x, 20.0))
    return tl.where(x > 20.0, x, tl.where(x < -15.0, e, tl.log(1.0 + e)))


@triton.jit
def _token_inputs(p_q, p_k, p_v, p_g, p_b, p_z, o_k, o_v, m_k, m_v, live, sv_d, sg_d, sb_d, sz_v,
                  b_dtb, scale,
                  GATE: tl.constexpr, BETA: tl.constexpr, L2NORM: tl.constexpr, DT_TIED: tl.constexpr,
                  DT_SOFTPLUS: tl.constexpr, HAS_Z: tl.constexpr):
    """Everything of one token that does not depend on the state (loaded one token ahead).

    Returns q [BK] (normalised, scaled), k [BK], v [BV], the gate (GATE 1: log decay; 2: [BK] log
    decays; 3: dt, scalar or [BV], discretized), beta (scalar or [BV]) and z [BV].
    """
    mk = m_k & live
    mv = m_v & live
    b_q = tl.load(p_q + o_k, mask=mk, other=0.0).to(tl.float32)  # [BK]
    b_k = tl.load(p_k + o_k, mask=mk, other=0.0).to(tl.float32)  # [BK]
    b_v = tl.load(p_v + o_v * sv_d, mask=mv, other=0.0).to(tl.float32)  # [BV]
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    b_g = 0.0
    if GATE == 1:
        b_g = tl.load(p_g, mask=live, other=0.0).to(tl.float32)
    elif GATE == 2:
        b_g = tl.load(p_g + o_k * sg_d, mask=mk, other=0.0).to(tl.float32)  # [BK]
    elif GATE == 3:
        if DT_TIED:
            b_g = tl.load(p_g, mask=live, other=0.0).to(tl.float32) + b_dtb
        else:
            b_g = tl.load(p_g + o_v * sg_d, mask=mv, other=0.0).to(tl.float32) + b_dtb  # [BV]
        if DT_SOFTPLUS:
            b_g = _softplus(b_g)
    b_beta = 1.0
    if GATE == 3:
        b_beta = b_g  # SSD writes dt * x
    elif BETA == 1:
        b_beta = tl.load(p_b, mask=live, other=0.0).to(tl.float32)
    elif BETA == 2:
        b_beta = tl.load(p_b + o_v * sb_d, mask=mv, other=0.0).to(tl.float32)  # [BV]
    b_z = 0.0
    if HAS_Z:
        b_z = tl.load(p_z + o_v * sz_v, mask=mv, other=0.0).to(tl.float32)  # [BV]
    return b_q, b_k, b_v, b_g, b_beta, b_z


@triton.jit(do_not_specialize=["T", "t_begin", "t_end", "n_snap", "n_slots"])
def streaming_recurrence_kernel(
    q, k, v, g, beta, o, A, dt_bias, D, z,
    h0, hin, ht, slots, snaps, accepted, cu_seqlens,
    scale, T, t_begin, t_end, n_snap, n_slots,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sv_d,
    sg_b, sg_t, sg_h, sg_d, sb_b, sb_t, sb_h, sb_d, so_b, so_t, so_h,
    sz_b, sz_t, sz_h, sz_v, sA_h, sA_k, sA_v, sdb_h, sdb_v, sD_h, sD_v,
    s0_n, s0_h, s0_k, s0_v, si_n, si_h, si_k, si_v, s1_n, s1_h, s1_k, s1_v,
    ss_n, ss_t, ss_h, ss_k, ss_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    DELTA: tl.constexpr, GATE: tl.constexpr, BETA: tl.constexpr, L2NORM: tl.constexpr,
    DT_TIED: tl.constexpr, A_TIED: tl.constexpr, DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, HT_BY_SLOT: tl.constexpr, HAS_SLOTS: tl.constexpr,
    STEPS: tl.constexpr, HAS_ACCEPTED: tl.constexpr, VARLEN: tl.constexpr,
    HANDOFF: tl.constexpr, PREFETCH: tl.constexpr, EVICT: tl.constexpr,
):
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)  # grouped value heads: q/k head of this value head

    if VARLEN:  # clamped to [0, T]: a wrong cu_seqlens reads and writes no token outside the inputs
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
        L = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos), T) - bos
        row = i_n * 0
    else:
        bos = i_n * 0
        L = i_n * 0 + T
        row = i_n
    t_stop = tl.minimum(L, t_end)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]

    p_o = o + row * so_b + bos * so_t + i_hv * so_h + o_v  # [BV] at token 0 of the sequence

    slot = i_n
    if HAS_SLOTS:
        slot = tl.load(slots + i_n).to(tl.int64)
        if (slot < 0) | (slot >= n_slots):  # padding (or no slot of the cache): zero output, no state access
            for t in range(t_begin, t_stop):
                tl.store(p_o + (i_n * 0 + t) * so_t, tl.zeros([BV], tl.float32).to(o.dtype.element_ty),
                         mask=m_v)
            return
    # 1. The state tile, loaded first (it depends only on the slot).
    b_h = tl.zeros([BK, BV], dtype=tl.float32)  # [BK, BV]
    if not HANDOFF:
        p_0 = h0 + slot * s0_n + i_hv * s0_h + o_k[:, None] * s0_k + o_v[None, :] * s0_v  # [BK, BV]
        if HAS_ACCEPTED:  # start from the last accepted draft token's snapshot, if any
            a = tl.minimum(tl.load(accepted + i_n).to(tl.int64), n_snap)
            if a > 0:
                p_s = snaps + slot * ss_n + (a - 1) * ss_t + i_hv * ss_h
                b_h = tl.load(p_s + o_k[:, None] * ss_k + o_v[None, :] * ss_v, mask=m_h, other=0.0,
                              eviction_policy=EVICT).to(tl.float32)
            else:
                if USE_H0:
                    b_h = tl.load(p_0, mask=m_h, other=0.0, eviction_policy=EVICT).to(tl.float32)
        else:
            if USE_H0:
                b_h = tl.load(p_0, mask=m_h, other=0.0, eviction_policy=EVICT).to(tl.float32)
    else:  # handed on by the previous launch (float32, indexed by sequence)
        p_i = hin + i_n * si_n + i_hv * si_h
        b_h = tl.load(p_i + o_k[:, None] * si_k + o_v[None, :] * si_v, mask=m_h, other=0.0).to(tl.float32)

    # 2. Per-head constants (SSD).
    b_dtb = 0.0
    if HAS_DT_BIAS:
        if DT_TIED:
            b_dtb = tl.load(dt_bias + i_hv * sdb_h).to(tl.float32)
        else:
            b_dtb = tl.load(dt_bias + i_hv * sdb_h + o_v * sdb_v, mask=m_v, other=0.0).to(tl.float32)
    b_A = 0.0
    if GATE == 3:
        if A_TIED:
            b_A = tl.load(A + i_hv * sA_h).to(tl.float32)
        else:
            b_A = tl.load(A + i_hv * sA_h + o_k[:, None] * sA_k + o_v[None, :] * sA_v, mask=m_h,
                          other=0.0).to(tl.float32)  # [BK, BV]
    b_D = 0.0
    if HAS_D:
        b_D = tl.load(D + i_hv * sD_h + o_v * sD_v, mask=m_v, other=0.0).to(tl.float32)  # [BV]

    # 3. The token loop (runtime bounds). PREFETCH: the next token's inputs are loaded (and
    #    normalised) while this token's state update runs, off the state's dependency chain.
    p_q = q + row * sq_b + bos * sq_t + i_h * sq_h
    p_k = k + row * sk_b + bos * sk_t + i_h * sk_h
    p_v = v + row * sv_b + bos * sv_t + i_hv * sv_h
    p_g = g + row * sg_b + bos * sg_t + i_hv * sg_h
    p_b = beta + row * sb_b + bos * sb_t + i_hv * sb_h
    p_z = z + row * sz_b + bos * sz_t + i_hv * sz_h
    t0 = t_begin + i_n * 0  # int64
    if PREFETCH:
        b_q, b_k, b_v, b_g, b_beta, b_z = _token_inputs(
            p_q + t0 * sq_t, p_k + t0 * sk_t, p_v + t0 * sv_t, p_g + t0 * sg_t, p_b + t0 * sb_t, p_z + t0 * sz_t,
            o_k, o_v, m_k, m_v, t0 < t_stop, sv_d, sg_d, sb_d, sz_v, b_dtb, scale,
            GATE, BETA, L2NORM, DT_TIED, DT_SOFTPLUS, HAS_Z)
    for t in range(t_begin, t_stop):
        tn = i_n * 0 + t + 1  # int64 (pool and token offsets pass 2**31)
        if PREFETCH:
            n_q, n_k, n_v, n_g, n_beta, n_z = _token_inputs(
                p_q + tn * sq_t, p_k + tn * sk_t, p_v + tn * sv_t, p_g + tn * sg_t, p_b + tn * sb_t,
                p_z + tn * sz_t, o_k, o_v, m_k, m_v, tn < t_stop, sv_d, sg_d, sb_d, sz_v, b_dtb, scale,
                GATE, BETA, L2NORM, DT_TIED, DT_SOFTPLUS, HAS_Z)
        else:
            tc = tn - 1
            b_q, b_k, b_v, b_g, b_beta, b_z = _token_inputs(
                p_q + tc * sq_t, p_k + tc * sk_t, p_v + tc * sv_t, p_g + tc * sg_t, p_b + tc * sb_t,
                p_z + tc * sz_t, o_k, o_v, m_k, m_v, tc < t_stop, sv_d, sg_d, sb_d, sz_v, b_dtb, scale,
                GATE, BETA, L2NORM, DT_TIED, DT_SOFTPLUS, HAS_Z)
        # decay
        if GATE == 1:
            b_h *= tl.exp(b_g)
        elif GATE == 2:
            b_h *= tl.exp(b_g)[:, None]
        elif GATE == 3:
            if A_TIED:
                if DT_TIED:
                    b_h *= tl.exp(b_A * b_g)
                else:
                    b_h *= tl.exp(b_A * b_g)[None, :]
            else:
                if DT_TIED:
                    b_h *= tl.exp(b_A * b_g)
                else:
                    b_h *= tl.exp(b_A * b_g[None, :])
        # write and read
        if PREFETCH:
            # Several tokens: the state's update is the chain from token to token; the read of the
            # updated tile is off it.
            if DELTA:
                b_u = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))  # [BV]
            else:
                b_u = b_beta * b_v
            b_h += b_k[:, None] * b_u[None, :]
            b_o = tl.sum(b_h * b_q[:, None], 0)  # [BV]
        else:
            # One token (decode): the program's whole life is this chain, so read from the decayed
            # tile, o = S_new^T q = S^T q + (k.q) u, beside the S^T k reduction: no pass over the
            # updated tile, and on multi-warp tiles the two cross-warp sums overlap (stream_config's
            # one-token row). S^T q is written first: the other order scheduled 2.5 points slower
            # at 256 requests. On the multi-token path the extra k.q reduction made streaming
            # prefill 11% slower, so it keeps the order above.
            b_qh = tl.sum(b_h * b_q[:, None], 0)  # [BV]
            if DELTA:
                b_u = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))  # [BV]
            else:
                b_u = b_beta * b_v
            b_h += b_k[:, None] * b_u[None, :]
            b_o = b_qh + tl.sum(b_k * b_q) * b_u  # [BV]
        if HAS_D:
            b_o += b_D * b_v
        if HAS_Z:
            b_o *= b_z * tl.sigmoid(b_z)
        tl.store(p_o + (tn - 1) * so_t, b_o.to(o.dtype.element_ty), mask=m_v)
        if STEPS > 0:  # speculative decoding: the state after each draft token, from registers
            if (tn % STEPS == 0) & (tn // STEPS <= n_snap):
                p_s = snaps + slot * ss_n + (tn // STEPS - 1) * ss_t + i_hv * ss_h
                tl.store(p_s + o_k[:, None] * ss_k + o_v[None, :] * ss_v, b_h.to(snaps.dtype.element_ty), mask=m_h,
                         eviction_policy=EVICT)
        if PREFETCH:
            b_q, b_k, b_v, b_g, b_beta, b_z = n_q, n_k, n_v, n_g, n_beta, n_z

    if STORE_HT:
        if HT_BY_SLOT:
            p_t = ht + slot * s1_n + i_hv * s1_h
        else:
            p_t = ht + i_n * s1_n + i_hv * s1_h
        tl.store(p_t + o_k[:, None] * s1_k + o_v[None, :] * s1_v, b_h.to(ht.dtype.element_ty), mask=m_h,
                 eviction_policy=EVICT)


# ------------------------------------------------------------------------------------------------
# Launch rules (data; the planner's part for the streaming kernel)
# ------------------------------------------------------------------------------------------------

#: Largest state column (K rows) a program keeps on chip, in float32 bytes: one column block of the
#: narrowest tile (4 columns) must fit in the registers of 8 warps with room to spare.
MAX_COLUMN_BYTES = 64 * 1024
#: Bound on the steps (tokens per sequence) of one dispatch, by device type; None: no bound.
#: CUDA reports none; a device with a watchdog (or a test) sets one, and the sequence is then run
#: as several launches that hand the state on.
DISPATCH_STEP_BOUND: dict[str, int | None] = {"cuda": None, "cpu": None}


class StateColumnTooLarge(ValueError):
    """A state column does not fit on chip: refused before launch."""


@dataclass(frozen=True)
class StreamConfig:
    BK: int
    BV: int
    num_warps: int
    num_stages: int
    reason: str
    evict: str = ""  # cache eviction policy of the state's loads and stores ("" or "evict_first")
    maxnreg: int | None = None  # a cap on registers per thread (more resident warps), None: the compiler's choice


def check_column_fits(K: int, what: str = "k") -> int:
    """BK for K key rows, or :class:`StateColumnTooLarge`."""
    BK = triton.next_power_of_2(K)
    if BK * 4 > MAX_COLUMN_BYTES:
        raise StateColumnTooLarge(
            f"{what}: a state column of {K} rows ({BK * 4 // 1024} KiB in float32) cannot fit on chip; the "
            f"streaming kernel keeps each column in registers, at most {MAX_COLUMN_BYTES // 1024} KiB per "
            f"column (K <= {MAX_COLUMN_BYTES // 4})")
    return BK


def stream_config(heads_total: int, K: int, V: int, tokens: int, state_bytes: int, delta: bool,
                  device: torch.device, vk_layout: bool = False) -> StreamConfig:
    """The launch shape by rule (no autotuning). Rows read top to bottom, first match decides.

    ``heads_total``: sequences x value heads (programs before the column split); ``tokens``: an
    upper bound on the steps of a sequence (host-known: T, or the packed length for varlen);
    ``vk_layout``: the state's key rows are contiguous (``[.., V, K]``, mamba's ``[.., P, N]``).
    The measurements behind each row are in docs/kernels-decode.md (H200, launch-shape sweep).
    """
    BK = check_column_fits(K)
    BVmax = triton.next_power_of_2(V)
    if device.type != "cuda":
        # The interpreter runs each program in Python: wide tiles, few programs.
        return StreamConfig(BK, min(BVmax, 32), 4, 1, "interpreter: wide tiles, fewest programs")
    sms = sm_count(device)

    def narrowest(BV, floor):  # halve the column block until there are >= 4 programs per SM
        while BV > floor and heads_total * triton.cdiv(V, BV) < 4 * sms:
            BV //= 2
        return BV

    if tokens >= 64:
        # Streaming prefill: per-token latency. One warp a program, so the key reductions are
        # warp shuffles, and 4 columns a program, so that the most programs run side by side.
        BV = min(BVmax, 4 if heads_total * triton.cdiv(V, 4) <= 16 * sms else 8)
        return StreamConfig(BK, BV, 1, 1, f"streaming prefill: {BV} columns a program, a column's rows over one "
                                          f"warp's lanes (shuffle reductions)")
    if vk_layout:
        # Key rows contiguous (mamba's [P, N], a [V, K] cache): one warp a program, 8 value rows of
        # K keys (4 KB fp32 tiles). The K reductions run along the lanes (shuffles), each load
        # instruction covers whole rows, and the small tiles (64 registers) leave room for many
        # resident warps: the most bytes in flight. Wider tiles or more warps were slower.
        BV = narrowest(min(BVmax, 8), min(BVmax, 4))
        return StreamConfig(BK, BV, 1, 1, f"decode, key-contiguous state: {BV} rows x {BK} keys on one warp "
                                          f"({BV * BK * state_bytes // 1024} KB tiles)")
    if tokens == 1 and state_bytes == 4 and heads_total * triton.cdiv(V, 64) >= 4 * sms:
        # [K, V] fp32 state, one token (decode of many requests): 64 columns on 4 warps (32 KB
        # tiles, 128 registers). The K rows spread over the warps, but with one token both key
        # reductions read the same decayed tile side by side (the kernel's T = 1 order), so the
        # cross-warp sums overlap: 93.5-93.7% of HBM bandwidth at 256 requests against 90.1% on one
        # warp (b0c636f). A bf16 state moves half the bytes per tile: 50% this way, 62.5% on one warp.
        BV = min(BVmax, 64)
        return StreamConfig(BK, BV, 4, 1, f"decode of one token, [K, V] state: {BV} columns on 4 warps "
                                          f"({BK * BV * state_bytes // 1024} KB tiles)")
    # [K, V] state (value columns contiguous): a column's K rows must stay within one warp for the
    # reductions to be shuffles, so one warp a program; 32 columns = 128-byte fp32 rows (16 KB).
    # Narrower than 16 columns (64-byte rows) is slower even for one request (H200: 3.7 us at 8
    # columns, 3.1 us at 16, CUDA-graph replay of 32 heads).
    BV = narrowest(min(BVmax, 32), min(BVmax, 16))
    return StreamConfig(BK, BV, 1, 1, f"decode, [K, V] state: {BV} columns a program on one warp "
                                      f"({BK * BV * state_bytes // 1024} KB tiles)")


# ------------------------------------------------------------------------------------------------
# The launcher
# ------------------------------------------------------------------------------------------------

_GATES = {None: 0, "scalar": 1, "per_key": 2, "ssd": 3}
_BETAS = {None: 0, "head": 1, "value": 2}


def _s(t: torch.Tensor | None, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(t.stride(d) for d in dims) if t is not None else (0,) * len(dims)


def _state_strides(t: torch.Tensor | None, vk: bool, lead: int = 2) -> tuple[int, ...]:
    """(row, [token,] head, key, value) strides of a state tensor [rows, (tokens,) heads, ., .]."""
    if t is None:
        return (0,) * (lead + 2)
    n = t.dim()
    kd, vd = (n - 1, n - 2) if vk else (n - 2, n - 1)
    return tuple(t.stride(d) for d in range(lead)) + (t.stride(kd), t.stride(vd))


def streaming_recurrence(q, k, v, o, *, scale: float, delta: bool, gate: str | None = None, g=None,
                         beta=None, beta_mode: str | None = None, l2norm: bool = False, cu_seqlens=None,
                         initial=None, final=None, final_by_slot: bool = False, slots=None, snaps=None,
                         steps_per_token: int = 1, accepted=None, vk_layout: bool = False,
                         A=None, dt_bias=None, D=None, z=None, dt_tied: bool = False, A_tied: bool = True,
                         dt_softplus: bool = False, config: StreamConfig | None = None, num_sequences: int,
                         ) -> None:
    """Launch the streaming kernel (results written into ``o``, ``final``, ``snaps``).

    Shapes (strided views are fine; q/k must be contiguous along their last dim):
        q, k ``[B, T, H, K]``; v, o ``[B, T, HV, V]``; g ``[B, T, HV]`` (scalar gate / SSD dt
        tied), ``[B, T, HV, K]`` (per key) or ``[B, T, HV, V]`` (SSD dt per column); beta
        ``[B, T, HV]`` or ``[B, T, HV, V]``; z ``[B, T, HV, V]``; A ``[HV]`` or ``[HV, V, K]``;
        dt_bias, D ``[HV, V]`` (stride 0 where tied).
        initial ``[rows, HV, K, V]`` (``vk_layout``: ``[rows, HV, V, K]``), read at ``slots[n]``
        (or n); final: written at ``slots[n]`` when ``final_by_slot`` else at n; snaps
        ``[S, n_snap, HV, K, V]`` (same layout) at ``slots[n]``.

    Host cost. A call whose tensors have the shapes, strides, dtypes, devices and 16-byte
    alignments of an earlier call (everything Triton specializes on) reuses that call's launch
    arguments and compiled kernel: a key, a list and the driver launch, no re-planning.
    """
    tensors = (q, k, v, g, beta, o, A, dt_bias, D, z, initial, final, slots, snaps, accepted, cu_seqlens)
    bound = DISPATCH_STEP_BOUND.get(q.device.type)
    key = (launch_key(tensors), delta, gate, beta_mode, l2norm, final_by_slot, steps_per_token, vk_layout, dt_tied,
           A_tied, dt_softplus, config, num_sequences, bound)
    hit = _LAUNCHES.get(key)
    if hit is None:
        hit = plan_stream(tensors, scale=scale, delta=delta, gate=gate, beta_mode=beta_mode, l2norm=l2norm,
                          final_by_slot=final_by_slot, steps_per_token=steps_per_token, vk_layout=vk_layout,
                          dt_tied=dt_tied, A_tied=A_tied, dt_softplus=dt_softplus, config=config,
                          num_sequences=num_sequences)
        if len(_LAUNCHES) > 4096:  # many distinct prompt lengths: start over rather than grow
            _LAUNCHES.clear()
        _LAUNCHES[key] = hit
    run_stream(hit, tensors, scale)


def run_stream(hit: "_Launch", tensors, scale: float) -> None:
    """Launch a planned call on ``tensors`` (the order of :func:`streaming_recurrence`; they must
    match the tensors it was planned with in :func:`launch_key`)."""
    global DIRECT_LAUNCH_ERROR
    values = tensors + (float(scale),)  # absent tensors are never read: the plan points them at o
    if hit.direct is not None:
        try:
            hit.direct(values)
            return
        except Exception as exc:  # never silently: recorded here, asserted None by the GPU tests
            DIRECT_LAUNCH_ERROR = f"{type(exc).__name__}: {exc}"
            hit.direct = None
    direct = _launch_jit(hit, tensors, values)
    hit.direct = direct if DIRECT_LAUNCH_ERROR is None else None


#: Set if a cached direct launch ever failed (the JIT path is then used for good); None is expected.
DIRECT_LAUNCH_ERROR: str | None = None


class _Launch:
    """The launch arguments of one call signature: grid, the kernel's arguments (per-call values
    as ``CallArg``), the number of launches, and the direct launch once compiled."""

    __slots__ = ("grid", "kwargs", "launches", "bound", "handoff_shape", "direct", "vk_layout", "final_by_slot",
                 "options")


def plan_stream(tensors, *, scale, delta, gate=None, beta_mode=None, l2norm=False, final_by_slot=False,
                steps_per_token=1, vk_layout=False, dt_tied=False, A_tied=True, dt_softplus=False, config=None,
                num_sequences) -> _Launch:
    """Plan a launch (config by rule, argument list, splits) from the tensors' shapes and strides;
    keeps no tensor. Arguments as :func:`streaming_recurrence`, tensors in its order."""
    (q, k, v, g, beta, o, A, dt_bias, D, z, initial, final, slots, snaps, accepted, cu_seqlens) = tensors
    bound = DISPATCH_STEP_BOUND.get(q.device.type)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if config is None:
        sbytes = max((t.element_size() for t in (initial, final) if t is not None), default=4)
        config = stream_config(num_sequences * HV, K, V, T, sbytes, delta, q.device,
                               vk_layout=vk_layout or key_contiguous(initial if initial is not None else final))
    steps = int(snaps is not None) and steps_per_token
    gate_dims = (0, 1, 2, 3) if (g is not None and g.dim() == 4) else (0, 1, 2)
    sg = _s(g, gate_dims) + ((0,) if len(gate_dims) == 3 else ())
    sb = _s(beta, (0, 1, 2)) + ((beta.stride(3),) if beta is not None and beta.dim() == 4 else (0,))
    sA = ((A.stride(0),) + ((A.stride(2), A.stride(1)) if A.dim() == 3 else (0, 0))) if A is not None else (0, 0, 0)
    strides = (_s(q, (0, 1, 2)) + _s(k, (0, 1, 2)) + _s(v, (0, 1, 2, 3)) + sg + sb + _s(o, (0, 1, 2))
               + _s(z, (0, 1, 2, 3)) + sA + _s(dt_bias, (0, 1)) + _s(D, (0, 1))
               + _state_strides(initial, vk_layout) + (0, 0, 0, 0) + _state_strides(final, vk_layout)
               + _state_strides(snaps, vk_layout, lead=3))
    flags = dict(H=H, HV=HV, K=K, V=V, BK=config.BK, BV=config.BV, DELTA=bool(delta), GATE=_GATES[gate],
                 BETA=_BETAS[beta_mode], L2NORM=bool(l2norm), DT_TIED=bool(dt_tied), A_TIED=bool(A_tied),
                 DT_SOFTPLUS=bool(dt_softplus), HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None,
                 HAS_Z=z is not None, USE_H0=initial is not None, STORE_HT=final is not None,
                 HT_BY_SLOT=bool(final_by_slot), HAS_SLOTS=slots is not None, STEPS=steps,
                 HAS_ACCEPTED=accepted is not None, VARLEN=cu_seqlens is not None, HANDOFF=False,
                 PREFETCH=T > 1, EVICT=config.evict)
    # Slots index the cache, its snapshots and (by slot) the final state: bounded by the fewest rows.
    n_slots = min([t.shape[0] for t in (initial, final if final_by_slot else None, snaps) if t is not None],
                  default=0)
    kw = dict(zip(_STRIDE_NAMES, strides), **flags, scale=CallArg("scale"), T=T, t_begin=0, t_end=T,
              n_snap=snaps.shape[1] if snaps is not None else 0, n_slots=n_slots)
    for name, t in zip(_TENSOR_NAMES, tensors):
        kw[name] = CallArg(name if t is not None else "o")  # an absent pointer: o (its flag keeps it unread)
    kw["hin"] = CallArg("o")  # the hand-off input of split launches; unread by a single launch
    hit = _Launch()
    hit.grid = (num_sequences * HV * triton.cdiv(V, config.BV),)
    hit.kwargs = kw
    hit.launches = 1 if bound is None or T <= bound else triton.cdiv(T, bound)
    hit.bound = bound
    hit.handoff_shape = (num_sequences, HV, K, V)
    hit.direct = None
    hit.vk_layout, hit.final_by_slot = vk_layout, final_by_slot
    hit.options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    if config.maxnreg is not None:
        hit.options["maxnreg"] = config.maxnreg
    return hit


def _launch_jit(hit: _Launch, tensors, values):
    """Launch through Triton's JIT (compiles on first use); returns the direct launch when one
    launch covers the call (the cached fast path), else None."""
    if hit.launches == 1:
        return jit_launch(streaming_recurrence_kernel, hit.grid, hit.kwargs, hit.options, _CALL_NAMES, values)
    # Launch splits: each launch covers [t_begin, t_end) of every sequence; the state is handed on
    # through a float32 buffer indexed by sequence; only the last launch writes ``final``.
    kw = resolve(hit.kwargs, _CALL_NAMES, values)
    final = tensors[11]
    handoff = torch.empty(hit.handoff_shape, dtype=torch.float32, device=tensors[0].device)
    sh = _state_strides(handoff, False)
    for i in range(hit.launches):
        last = i == hit.launches - 1
        out = final if last else handoff
        kw.update(t_begin=i * hit.bound, t_end=(i + 1) * hit.bound, hin=handoff, HANDOFF=i > 0,
                  ht=out if out is not None else kw["o"], STORE_HT=out is not None,
                  HT_BY_SLOT=hit.final_by_slot if last else False)
        kw.update(zip(("si_n", "si_h", "si_k", "si_v"), sh))
        kw.update(zip(("s1_n", "s1_h", "s1_k", "s1_v"),
                      _state_strides(out, hit.vk_layout if last else False)))
        streaming_recurrence_kernel[hit.grid](**kw, **hit.options)
    return None


_STRIDE_NAMES = (
    "sq_b sq_t sq_h sk_b sk_t sk_h sv_b sv_t sv_h sv_d sg_b sg_t sg_h sg_d sb_b sb_t sb_h sb_d so_b so_t so_h "
    "sz_b sz_t sz_h sz_v sA_h sA_k sA_v sdb_h sdb_v sD_h sD_v s0_n s0_h s0_k s0_v si_n si_h si_k si_v "
    "s1_n s1_h s1_k s1_v ss_n ss_t ss_h ss_k ss_v").split()
# The kernel's tensor arguments, in the order streaming_recurrence gathers them.
_TENSOR_NAMES = ("q", "k", "v", "g", "beta", "o", "A", "dt_bias", "D", "z", "h0", "ht", "slots", "snaps",
                 "accepted", "cu_seqlens")
_CALL_NAMES = _TENSOR_NAMES + ("scale",)  # the per-call values of a direct launch, in order
_LAUNCHES: dict[tuple, "_Launch"] = {}
