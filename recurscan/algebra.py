"""The scan algebra: affine maps, scans, their backward passes, stable segment sums,
the chunkwise algorithm and its cost model.

This is the textbook layer. It imports nothing else from recurscan, so anyone can check it
against the mathematics without reading the rest of the library.

Conventions:

* One step is the affine map ``h -> a h + b``, written as the pair ``(a, b)``. ``a`` is a scalar,
  a diagonal (a tensor shaped like ``b``, or broadcastable to it) or a dense matrix (``b``'s shape
  plus one trailing dimension, so ``a @ b``). A matrix state's columns are vector recurrences, so
  a dense transition is only for vector states.
* ``compose(p1, p2)`` is "p1, then p2": ``(a2 a1, a2 b1 + b2)``, the later matrix on the left.
* Sequences put time on dim 0 for the scans; linear attention takes ``Q, K: [..., T, d_k]``,
  ``V: [..., T, d_v]``, natural-log decays ``log_a: [..., T]``, the state ``S_t = a_t S_{t-1} +
  k_t v_t^T`` of shape ``[..., d_k, d_v]`` and the read ``o_t = S_t^T q_t`` (no scale).

Inputs: torch tensors on any device, in their own dtype (mixed float dtypes promote). NumPy
arrays, lists and Python numbers are accepted too: when no argument is a torch tensor the work is
done in float64 on the CPU and the results come back as NumPy arrays ("NumPy in, NumPy out").
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

__all__ = [
    "compose",
    "compose_all",
    "sequential_scan",
    "hillis_steele_scan",
    "blelloch_scan",
    "parallel_linear_scan",
    "linear_recurrence_backward",
    "linear_attention_backward",
    "segsum",
    "chunked_gla",
    "ChunkCost",
    "chunk_cost",
    "step_time",
]


# ---------------------------------------------------------------------------------------------
# Inputs: one dtype and device for all arguments, and the promise of NumPy out for NumPy in.

def _to_torch(*xs):
    """The arguments as torch tensors of one float dtype and device, and whether to return NumPy."""
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    if tensors:
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        device, numpy_out = tensors[0].device, False
    else:
        dtype, device, numpy_out = torch.float64, torch.device("cpu"), True
    out = [None if x is None else torch.as_tensor(x, dtype=dtype, device=device) for x in xs]
    return out, numpy_out


def _back(result, numpy_out: bool):
    if not numpy_out:
        return result
    if isinstance(result, tuple):
        return tuple(_back(r, True) for r in result)
    return result.detach().cpu().numpy() if isinstance(result, torch.Tensor) else result


# ---------------------------------------------------------------------------------------------
# Affine maps.

def _is_dense(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() + 1


def _compose(p1, p2):
    (a1, b1), (a2, b2) = p1, p2
    if _is_dense(a2, b2):
        # The later step acts on everything the earlier one produced, so its matrix goes left.
        return a2 @ a1, (a2 @ b1.unsqueeze(-1)).squeeze(-1) + b2
    return a2 * a1, a2 * b1 + b2


def compose(p1, p2):
    """The single affine map equal to applying ``p1 = (a1, b1)`` and then ``p2 = (a2, b2)``.

    ``compose(p1, p2) = (a2 a1, a2 b1 + b2)``: the later step's matrix stands on the left in both
    components. Associative, not commutative for matrices. The identity is ``(1, 0)``.

    Args:
        p1, p2: pairs ``(a, b)`` of the same kind: ``a`` a scalar or a diagonal (elementwise,
            broadcast against ``b``), or a dense ``[..., N, N]`` matrix with ``b: [..., N]``.
            Leading dimensions act as a batch of maps.

    Returns:
        The pair ``(a, b)`` of the composed map.

    Example ("multiply by 0.5 and add 1", then "multiply by 0.5"):
        >>> from recurscan.algebra import compose
        >>> a, b = compose((0.5, 1.0), (0.5, 0.0))
        >>> float(a), float(b)
        (0.25, 0.5)
    """
    (a1, b1, a2, b2), numpy_out = _to_torch(*p1, *p2)
    return _back(_compose((a1, b1), (a2, b2)), numpy_out)


def compose_all(maps):
    """Compose a non-empty sequence of maps in order: ``maps[0]`` first, ``maps[-1]`` last.

    Args:
        maps: an iterable of pairs ``(a, b)``, all of one kind (see :func:`compose`).

    Returns:
        The pair ``(a, b)`` of the whole chain.

    Example:
        >>> from recurscan.algebra import compose_all
        >>> a, b = compose_all([(0.5, 1.0), (0.5, 0.0), (2.0, 1.0)])
        >>> float(a), float(b)
        (0.5, 2.0)
    """
    maps = list(maps)
    if not maps:
        raise ValueError("compose_all needs at least one map (the identity's size is unknown)")
    flat, numpy_out = _to_torch(*(x for p in maps for x in p))
    pairs = list(zip(flat[0::2], flat[1::2]))
    return _back(functools.reduce(_compose, pairs), numpy_out)


# ---------------------------------------------------------------------------------------------
# Scans. Each returns the inclusive prefixes (A_t, B_t) = step_1 then ... then step_t, and with
# return_count=True also the number of combines: one combine is one application of compose to
# one pair of maps, so a vectorized round over m pairs counts m.

def _scan_inputs(a, b):
    (a, b), numpy_out = _to_torch(a, b)
    if not _is_dense(a, b):
        a, b = torch.broadcast_tensors(a, b)
    return a, b, numpy_out


def _scan_result(A, B, count, return_count, numpy_out):
    out = (A, B, count) if return_count else (A, B)
    return _back(out, numpy_out)


def sequential_scan(a, b, return_count: bool = False):
    """Inclusive prefixes of the steps ``(a_t, b_t)`` by a plain loop: work and depth ``T - 1``.

    Args:
        a: ``[T, ...]`` decays: shaped like ``b`` (scalar state or diagonal; size-1 dims
            broadcast), or ``[T, N, N]`` dense transitions with ``b: [T, N]``.
        b: ``[T, ...]`` inputs.
        return_count: also return the number of combines.

    Returns:
        ``(A, B)`` with ``(A_t, B_t)`` the map of steps 1..t (so ``B_t`` is ``h_t`` from
        ``h_0 = 0``), or ``(A, B, count)``.

    Example:
        >>> from recurscan.algebra import sequential_scan
        >>> A, B, n = sequential_scan([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], return_count=True)
        >>> B.tolist(), n
        ([1.0, 1.5, 1.75], 2)
    """
    a, b, numpy_out = _scan_inputs(a, b)
    T = a.shape[0]
    if T == 0:
        return _scan_result(a.clone(), b.clone(), 0, return_count, numpy_out)
    A, B = [a[0]], [b[0]]
    for t in range(1, T):
        At, Bt = _compose((A[-1], B[-1]), (a[t], b[t]))
        A.append(At)
        B.append(Bt)
    return _scan_result(torch.stack(A), torch.stack(B), T - 1, return_count, numpy_out)


def hillis_steele_scan(a, b, return_count: bool = False):
    """Inclusive prefixes by Hillis-Steele: each round combines with the element ``d`` places
    to the left, ``d = 1, 2, 4, ...``; depth ``ceil(log2 T)``, work ``sum_d (T - d)``.

    Args, returns: as :func:`sequential_scan`. At ``T = 1000`` the count is 8977.

    Example:
        >>> from recurscan.algebra import hillis_steele_scan
        >>> A, B, n = hillis_steele_scan([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], return_count=True)
        >>> B.tolist(), n
        ([1.0, 1.5, 1.75], 3)
    """
    a, b, numpy_out = _scan_inputs(a, b)
    T = a.shape[0]
    A, B, count, d = a.clone(), b.clone(), 0, 1
    while d < T:
        # Every position reads the previous round's values, so build the round before writing.
        newA, newB = _compose((A[:-d], B[:-d]), (A[d:], B[d:]))
        A = torch.cat([A[:d], newA])
        B = torch.cat([B[:d], newB])
        count += T - d
        d *= 2
    return _scan_result(A, B, count, return_count, numpy_out)


def blelloch_scan(a, b, return_count: bool = False):
    """Inclusive prefixes by Blelloch's work-efficient scan: an up-sweep and a down-sweep over a
    binary tree, on the length padded with identity steps to the next power of two ``n``.

    Work: ``n - 1`` combines up, ``n - 1`` down (an exclusive scan), then ``T`` more to make it
    inclusive; depth ``2 log2 n + 1``. At ``T = 1000``: 1023 + 1023 + 1000 = 3046.

    Args, returns: as :func:`sequential_scan`.

    Example:
        >>> from recurscan.algebra import blelloch_scan
        >>> A, B, n = blelloch_scan([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], return_count=True)
        >>> B.tolist(), n
        ([1.0, 1.5, 1.75], 9)
    """
    a, b, numpy_out = _scan_inputs(a, b)
    T = a.shape[0]
    if T == 0:
        return _scan_result(a.clone(), b.clone(), 0, return_count, numpy_out)
    n = 1 << (T - 1).bit_length()
    if _is_dense(a, b):
        one = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a[0])
    else:
        one = torch.ones_like(a[0])
    zero = torch.zeros_like(b[0])
    A = torch.cat([a, one.expand(n - T, *one.shape)])
    B = torch.cat([b, zero.expand(n - T, *zero.shape)])
    count = 0

    d = 1
    while d < n:  # up-sweep: node i = 2dk + 2d - 1 becomes (its left half) then (its right half)
        A[2 * d - 1 :: 2 * d], B[2 * d - 1 :: 2 * d] = _compose(
            (A[d - 1 :: 2 * d], B[d - 1 :: 2 * d]), (A[2 * d - 1 :: 2 * d], B[2 * d - 1 :: 2 * d])
        )
        count += n // (2 * d)
        d *= 2

    A[n - 1], B[n - 1] = one, zero  # the exclusive prefix of the whole tree is empty
    d = n // 2
    while d >= 1:  # down-sweep: a node holds the map of everything to its left
        left_a, left_b = A[d - 1 :: 2 * d].clone(), B[d - 1 :: 2 * d].clone()
        pre_a, pre_b = A[2 * d - 1 :: 2 * d].clone(), B[2 * d - 1 :: 2 * d].clone()
        A[d - 1 :: 2 * d], B[d - 1 :: 2 * d] = pre_a, pre_b
        # The prefix arriving from the left is the earlier map, so it stays the first argument.
        A[2 * d - 1 :: 2 * d], B[2 * d - 1 :: 2 * d] = _compose((pre_a, pre_b), (left_a, left_b))
        count += n // (2 * d)
        d //= 2

    A, B = _compose((A[:T], B[:T]), (a, b))  # exclusive -> inclusive
    count += T
    return _scan_result(A, B, count, return_count, numpy_out)


def parallel_linear_scan(a, b, h0=None, return_count: bool = False):
    """The states ``h_1..h_T`` of ``h_t = a_t * h_{t-1} + b_t`` by the Blelloch scan.

    The initial state is folded into the first step, ``b_1 <- b_1 + a_1 h_0``, and the scan then
    runs as if ``h_0 = 0``: that is how a long sequence is processed piece by piece.

    Args:
        a: ``[T, N]`` (or ``[T]``, or any ``[T, ...]`` shaped like ``b``) decays; ``[T, N, N]``
            dense transitions also work.
        b: ``[T, N]`` inputs.
        h0: ``[N]`` initial state; ``None`` means zeros.
        return_count: also return the number of combines.

    Returns:
        ``h: [T, N]``, or ``(h, count)``.

    Example (h0 = 2 and first step (0.5, 1) give h1 = 2):
        >>> from recurscan.algebra import parallel_linear_scan
        >>> parallel_linear_scan([0.5, 0.5], [1.0, 0.0], h0=2.0).tolist()
        [2.0, 1.0]
    """
    (a, b, h0), numpy_out = _to_torch(a, b, h0)
    if h0 is not None and a.shape[0] > 0:
        first = (a[0] @ h0.unsqueeze(-1)).squeeze(-1) if _is_dense(a, b) else a[0] * h0
        b = torch.cat([(b[0] + first).unsqueeze(0), b[1:]])
    _, h, count = blelloch_scan(a, b, return_count=True)
    return _back((h, count) if return_count else h, numpy_out)


# ---------------------------------------------------------------------------------------------
# Backward passes.

def linear_recurrence_backward(a, b, h0, g):
    """Gradients of a loss through the diagonal recurrence ``h_t = a_t * h_{t-1} + b_t``.

    The adjoint ``hbar_t = g_t + a_{t+1} hbar_{t+1}`` is itself a linear recurrence, run backward
    in time: the same scan on reversed arrays, with the decays shifted by one place. Then
    ``da_t = hbar_t h_{t-1}``, ``db_t = hbar_t`` and ``dh0 = a_1 hbar_1``. The states are
    recomputed here by a forward scan.

    Args:
        a, b: ``[T, N]`` (or ``[T]``) decays and inputs.
        h0: ``[N]`` initial state, or ``None`` for zeros (its gradient is still returned).
        g: ``[T, N]`` direct gradients ``dL/dh_t`` (other states held fixed).

    Returns:
        ``(da, db, dh0)`` shaped like ``a``, ``b`` and one step of ``b``.

    Example (L = h_2 with h_1 = 0.5*1 + 1, h_2 = 0.5 h_1 + 1):
        >>> from recurscan.algebra import linear_recurrence_backward
        >>> da, db, dh0 = linear_recurrence_backward([0.5, 0.5], [1.0, 1.0], 1.0, [0.0, 1.0])
        >>> da.tolist(), db.tolist(), float(dh0)
        ([0.5, 1.5], [0.5, 1.0], 0.25)
    """
    (a, b, h0, g), numpy_out = _to_torch(a, b, h0, g)
    a, b, g = torch.broadcast_tensors(a, b, g)
    if h0 is None:
        h0 = b.new_zeros(b.shape[1:])
    h = parallel_linear_scan(a, b, h0)
    # Reverse time; the gradient passes from t+1 back to t through a_{t+1}. The first reversed
    # decay multiplies a zero initial adjoint, so its value does not matter.
    a_next = torch.cat([a[1:], torch.ones_like(a[:1])])
    hbar = parallel_linear_scan(a_next.flip(0), g.flip(0)).flip(0)
    h_prev = torch.cat([h0.expand_as(b[:1]), h[:-1]])
    return _back((hbar * h_prev, hbar, a[0] * hbar[0]), numpy_out)


def linear_attention_backward(Q, K, V, log_a, dO):
    """Gradients of linear attention with a scalar decay per step, without stored states.

    Forward: ``S_t = a_t S_{t-1} + k_t v_t^T`` from ``S_0 = 0``, ``o_t = S_t^T q_t``, ``a_t =
    exp(log_a_t)``. The query gradient ``dq_t = S_t do_t`` needs the forward state, so it comes
    from a forward sweep. Keys and values reach every later read, so theirs come from the adjoint
    ``Sbar_t = q_t do_t^T + a_{t+1} Sbar_{t+1}`` in a backward sweep: ``dk_t = Sbar_t v_t``,
    ``dv_t = Sbar_t^T k_t``. Each sweep holds one ``d_k x d_v`` state at a time.

    The decay gradient has a closed form: raising ``log_a_u`` scales exactly the
    write-to-read paths that cross step ``u``, which are the reads from ``u`` on minus the writes
    from ``u`` on, ``dlog_a_u = sum_{t>=u} (q_t . dq_t - k_t . dk_t)``. No ``S_{t-1}`` is needed.

    Args:
        Q, K: ``[..., T, d_k]``; V: ``[..., T, d_v]``; log_a: ``[..., T]`` natural-log decays
            (``-inf`` is a reset); dO: ``[..., T, d_v]`` the gradient at the outputs.

    Returns:
        ``(dQ, dK, dV, dlog_a)`` shaped like ``Q``, ``K``, ``V``, ``log_a``.

    Example (one token: o = (q . k) v):
        >>> from recurscan.algebra import linear_attention_backward
        >>> dQ, dK, dV, dl = linear_attention_backward([[2.0]], [[3.0]], [[1.0]], [0.0], [[1.0]])
        >>> dQ.tolist(), dK.tolist(), dV.tolist(), dl.tolist()
        ([[3.0]], [[2.0]], [[6.0]], [0.0])
    """
    (Q, K, V, log_a, dO), numpy_out = _to_torch(Q, K, V, log_a, dO)
    T = Q.shape[-2]
    a = log_a.exp()
    S = Q.new_zeros(*Q.shape[:-2], Q.shape[-1], V.shape[-1])
    dQ, dK, dV = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(V)
    for t in range(T):
        S = a[..., t, None, None] * S + K[..., t, :, None] * V[..., t, None, :]
        dQ[..., t, :] = (S @ dO[..., t, :, None]).squeeze(-1)
    Sbar = torch.zeros_like(S)
    for t in reversed(range(T)):
        if t + 1 < T:
            Sbar = a[..., t + 1, None, None] * Sbar
        Sbar = Sbar + Q[..., t, :, None] * dO[..., t, None, :]
        dK[..., t, :] = (Sbar @ V[..., t, :, None]).squeeze(-1)
        dV[..., t, :] = (Sbar.transpose(-1, -2) @ K[..., t, :, None]).squeeze(-1)
    # One reverse cumulative sum of the difference: a token's read of its own write appears in
    # both terms and cancels within its own step.
    diff = (Q * dQ).sum(-1) - (K * dK).sum(-1)
    dlog_a = diff.flip(-1).cumsum(-1).flip(-1)
    return _back((dQ, dK, dV, dlog_a), numpy_out)


# ---------------------------------------------------------------------------------------------
# Segment sums and the chunkwise algorithm.

def segsum(log_a: torch.Tensor) -> torch.Tensor:
    """Segment sums of logs, built from each segment's own terms.

    Args:
        log_a: ``[..., T]`` log decays (natural log; ``-inf`` is a reset).

    Returns:
        ``[..., T, T]`` with entry ``[i, j] = sum_{u=j+1}^{i} log_a[u]`` for ``i >= j``
        (so the diagonal is 0) and ``-inf`` above the diagonal. ``exp`` of it is the segment
        product ``a_{i:j}``. No cumulative sum is ever subtracted, so a reset gives ``-inf``
        (a product of 0), never ``-inf - (-inf) = NaN``.

    Example:
        >>> import torch
        >>> from recurscan.algebra import segsum
        >>> segsum(torch.log(torch.tensor([0.5, 0.5, 0.5]))).exp()
        tensor([[1.0000, 0.0000, 0.0000],
                [0.5000, 1.0000, 0.0000],
                [0.2500, 0.5000, 1.0000]])
    """
    if not isinstance(log_a, torch.Tensor):  # NumPy in, NumPy out (float64)
        return _back(segsum(torch.as_tensor(log_a, dtype=torch.float64)), True)
    T = log_a.shape[-1]
    # Row i of column j holds log_a[i] when i > j; cumulative sums down each column then add
    # exactly the terms j+1..i of that column's segment.
    x = log_a.unsqueeze(-1).expand(*log_a.shape, T)
    strict = torch.tril(torch.ones(T, T, dtype=torch.bool, device=log_a.device), diagonal=-1)
    x = x.masked_fill(~strict, 0)
    out = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=log_a.device), diagonal=0)
    return out.masked_fill(~lower, float("-inf"))


def chunked_gla(Q, K, V, log_a, T_c: int, S0=None):
    """Linear attention with a scalar decay per step, by the chunkwise algorithm.

    The sequence is cut into ``ceil(T / T_c)`` chunks (the last may be short). Inside a chunk of
    length ``c`` starting after step ``t0``, with local positions ``r, s = 1..c``:

    * mask ``D[r, s] = a_{t0+r : t0+s}`` for ``s <= r`` (diagonal 1: a token reads its own write
      undecayed),
    * decay from the chunk start ``lam_r = a_{t0+r : t0}`` (includes the first token's decay),
    * decay to the chunk end ``gam_s = a_{t0+c : t0+s}`` (excludes the writer's own, ``gam_c = 1``),

    and ``O = ((Q K^T) * D) V + diag(lam) Q S_in``, ``S_out = lam_c S_in + K^T diag(gam) V``.
    Only the chunk-to-chunk state update is sequential. All decays come from one :func:`segsum`
    over the chunk's logs with a zero prepended, so nothing is divided or subtracted.

    Args:
        Q, K: ``[..., T, d_k]``; V: ``[..., T, d_v]``; log_a: ``[..., T]`` natural-log decays
            (``-inf`` is a reset).
        T_c: chunk length, ``>= 1``.
        S0: ``[..., d_k, d_v]`` initial state; ``None`` means zeros.

    Returns:
        ``(O, S_T)``: ``O: [..., T, d_v]`` with ``o_t = S_t^T q_t``, and the final state.

    Example (no decay, one chunk: o_t = sum_{s<=t} (q_t . k_s) v_s):
        >>> from recurscan.algebra import chunked_gla
        >>> O, S = chunked_gla([[1.0], [1.0]], [[1.0], [2.0]], [[1.0], [1.0]], [0.0, 0.0], T_c=2)
        >>> O.tolist(), S.tolist()
        ([[1.0], [3.0]], [[3.0]])
    """
    if T_c < 1:
        raise ValueError(f"T_c must be >= 1, got {T_c}")
    (Q, K, V, log_a, S0), numpy_out = _to_torch(Q, K, V, log_a, S0)
    T, d_k, d_v = Q.shape[-2], Q.shape[-1], V.shape[-1]
    batch = Q.shape[:-2]
    S = Q.new_zeros(*batch, d_k, d_v) if S0 is None else S0.expand(*batch, d_k, d_v).clone()
    O = Q.new_empty(*batch, T, d_v)
    for t0 in range(0, T, T_c):
        t1 = min(t0 + T_c, T)
        q, k, v = Q[..., t0:t1, :], K[..., t0:t1, :], V[..., t0:t1, :]
        # With a zero in front, entry [i, j] sums the logs of local tokens j+1..i (1-based), so
        # column 0 gives lam, the last row gives gam, and the inner block gives the mask.
        seg = segsum(torch.nn.functional.pad(log_a[..., t0:t1], (1, 0))).exp()
        D, lam, gam, total = seg[..., 1:, 1:], seg[..., 1:, 0], seg[..., -1, 1:], seg[..., -1, 0]
        O[..., t0:t1, :] = ((q @ k.transpose(-1, -2)) * D) @ v + lam[..., None] * (q @ S)
        S = total[..., None, None] * S + k.transpose(-1, -2) @ (gam[..., None] * v)
    return _back((O, S), numpy_out)


# ---------------------------------------------------------------------------------------------
# Cost model.

class ChunkCost(NamedTuple):
    """What :func:`chunk_cost` counts for one head."""

    flops: int  # matrix-product FLOPs (an m x k by k x n product costs 2mkn)
    sequential_steps: int  # chunk-to-chunk state updates, n_c = ceil(T / T_c)
    state_numbers: int  # numbers in the chunk-boundary states written, n_c * d_k * d_v


def _chunks(T: int, T_c: int) -> list[tuple[int, int]]:
    """``(length, how many)`` for the full chunks and the short last one."""
    if T_c < 1 or T < 0:
        raise ValueError(f"need T >= 0 and T_c >= 1, got T={T}, T_c={T_c}")
    full, last = divmod(T, T_c)
    return [(T_c, full)] + ([(last, 1)] if last else [])


def chunk_cost(T: int, T_c: int, d_k: int, d_v: int) -> ChunkCost:
    """Matrix-product FLOPs, sequential steps and stored state of :func:`chunked_gla`, one head.

    A chunk of length ``c`` costs ``2 c^2 d_k`` (scores ``Q K^T``) ``+ 2 c^2 d_v`` (scores times
    ``V``) ``+ 2 c d_k d_v`` (inter-chunk read ``Q S``) ``+ 2 c d_k d_v`` (state update
    ``K^T diag(gam) V``). There are ``n_c = ceil(T / T_c)`` chunks; the last has length
    ``T - (n_c - 1) T_c`` and is counted at that length. Each chunk writes one ``d_k x d_v`` state
    (what the backward pass keeps instead of one state per token).

    Args:
        T: sequence length (``>= 0``). T_c: chunk length (``>= 1``). d_k, d_v: head dims.

    Returns:
        :class:`ChunkCost` ``(flops, sequential_steps, state_numbers)``.

    Example (two full chunks of 64 at d_k = d_v = 64):
        >>> from recurscan.algebra import chunk_cost
        >>> chunk_cost(128, 64, 64, 64)
        ChunkCost(flops=4194304, sequential_steps=2, state_numbers=8192)
    """
    flops = steps = 0
    for c, count in _chunks(T, T_c):
        flops += count * (2 * c * c * (d_k + d_v) + 4 * c * d_k * d_v)
        steps += count
    return ChunkCost(flops, steps, steps * d_k * d_v)


def _scalar_ops(T: int, T_c: int, d_k: int, d_v: int) -> int:
    # Per chunk of length c: the decay mask on the c x c scores (c^2), lam on the rows of Q
    # (c d_k), gam on the rows of V (c d_v), and the total decay on the state (d_k d_v).
    return sum(count * (c * c + c * (d_k + d_v) + d_k * d_v) for c, count in _chunks(T, T_c))


def step_time(T: int, T_c: int, d_k: int, d_v: int, heads: int,
              peak_matmul: float, peak_scalar: float, latency: float) -> float:
    """Roofline time of :func:`chunked_gla` over ``heads`` independent heads, in seconds.

    The matrix products run on the tensor cores and the elementwise decay work on the ordinary
    units, which overlap, so a head takes ``max(flops / peak_matmul, scalar_ops / peak_scalar)``
    with ``flops`` from :func:`chunk_cost` and ``scalar_ops = sum over chunks of c^2 + c (d_k +
    d_v) + d_k d_v`` (the decay mask on the scores, the decays from the chunk start on ``Q``, the
    decays to the chunk end on ``V``, the decay of the state). Heads share the machine, so their
    times add. The chunks' state updates are a chain, each paying ``latency`` once for all heads.

    Args:
        T, T_c, d_k, d_v: as :func:`chunk_cost`. heads: number of heads (times batch).
        peak_matmul: matrix-product FLOP/s. peak_scalar: elementwise op/s.
        latency: seconds per sequential step.

    Returns:
        ``heads * max(matmul time, scalar time) + ceil(T / T_c) * latency``.

    Example (matmul-bound: 2 heads x 4194304 FLOPs at 1 TFLOP/s, plus 2 steps of 1 us):
        >>> from recurscan.algebra import step_time
        >>> round(step_time(128, 64, 64, 64, 2, 1e12, 1e11, 1e-6) * 1e6, 6)
        10.388608
    """
    cost = chunk_cost(T, T_c, d_k, d_v)
    per_head = max(cost.flops / peak_matmul, _scalar_ops(T, T_c, d_k, d_v) / peak_scalar)
    return heads * per_head + cost.sequential_steps * latency
