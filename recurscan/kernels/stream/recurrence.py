"""The streaming recurrence: one Triton kernel for every family, token by token.

Schedule (docs/kernels-decode.md)
---------------------------------
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
GDP (folded)               1        1 (the decay on each token's 1st copy) as GDN
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

FLAGGED (the fused prefill's fallback, launch/delta_fused.py): only the programs whose value
columns have a nonzero entry in their pair's row of ``flags [N * HV, V]`` run; the others return
at once, writing nothing (the value columns of the delta rule's state evolve apart: a column's
state and outputs read no other column).
"""
from __future__ import annotations

import triton
import triton.language as tl


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
    h0, hin, ht, slots, snaps, accepted, cu_seqlens, flags,
    scale, T, t_begin, t_end, n_snap, n_slots,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sv_d,
    sg_b, sg_t, sg_h, sg_d, sb_b, sb_t, sb_h, sb_d, so_b, so_t, so_h,
    sz_b, sz_t, sz_h, sz_v, sA_h, sA_k, sA_v, sdb_h, sdb_v, sD_h, sD_v,
    s0_n, s0_h, s0_k, s0_v, s1_n, s1_h, s1_k, s1_v,
    ss_n, ss_t, ss_h, ss_k, ss_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    DELTA: tl.constexpr, GATE: tl.constexpr, BETA: tl.constexpr, L2NORM: tl.constexpr,
    DT_TIED: tl.constexpr, A_TIED: tl.constexpr, DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, HT_BY_SLOT: tl.constexpr, HAS_SLOTS: tl.constexpr,
    STEPS: tl.constexpr, HAS_ACCEPTED: tl.constexpr, VARLEN: tl.constexpr,
    HANDOFF: tl.constexpr, PREFETCH: tl.constexpr, EVICT: tl.constexpr, FLAGGED: tl.constexpr = False,
):
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    if FLAGGED:  # only the value columns flagged in their pair's row of ``flags [N * HV, V]``
        o_f = i_v * BV + tl.arange(0, BV)
        if tl.max(tl.load(flags + i_nh * V + o_f, mask=o_f < V, other=0), axis=0) == 0:
            return
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
    else:  # handed on by the previous launch: a contiguous float32 [N, HV, K, V] buffer of this module's own
        p_i = hin + (i_n * HV + i_hv) * (K * V)
        b_h = tl.load(p_i + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.0).to(tl.float32)

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
