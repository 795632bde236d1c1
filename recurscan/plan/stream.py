"""Launch shapes of the streaming (token-by-token) kernel, kernels/stream/recurrence.py: a rule
table on the problem's sizes, read top to bottom, the first match decides. No autotuning. The
measurements behind the rows are in docs/perf-history.md (decode launch-shape sweeps)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .device import sm_count

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
class StreamShape:
    """How the streaming kernel launches: a [BK, BV] state tile a program, on num_warps warps."""

    BK: int
    BV: int
    num_warps: int
    num_stages: int
    reason: str
    evict: str = ""  # cache eviction policy of the state's loads and stores ("" or "evict_first")
    maxnreg: int | None = None  # a cap on registers per thread (more resident warps), None: the compiler's choice


@dataclass(frozen=True)
class StreamSizes:
    """What the rows read. ``heads_total``: sequences x value heads (programs before the column
    split); ``tokens``: an upper bound on a sequence's steps (T, or the packed length for varlen);
    ``key_contiguous``: the state's key rows are contiguous (``[.., V, K]``, mamba's ``[.., P, N]``)."""

    heads_total: int
    key_dim: int
    value_dim: int
    tokens: int
    state_bytes: int
    key_contiguous: bool = False


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def check_column_fits(K: int, what: str = "k") -> int:
    """BK for K key rows, or :class:`StateColumnTooLarge`."""
    BK = _next_power_of_2(K)
    if BK * 4 > MAX_COLUMN_BYTES:
        raise StateColumnTooLarge(
            f"{what}: a state column of {K} rows ({BK * 4 // 1024} KiB in float32) cannot fit on chip; the "
            f"streaming kernel keeps each column in registers, at most {MAX_COLUMN_BYTES // 1024} KiB per "
            f"column (K <= {MAX_COLUMN_BYTES // 4})")
    return BK


def stream_shape(s: StreamSizes, device: torch.device) -> StreamShape:
    """The launch shape by rule for sizes ``s`` on ``device``."""
    BK = check_column_fits(s.key_dim)
    BVmax = _next_power_of_2(s.value_dim)
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    if device.type != "cuda":
        # The interpreter runs each program in Python: wide tiles, few programs.
        return StreamShape(BK, min(BVmax, 32), 4, 1, "interpreter: wide tiles, fewest programs")
    sms = sm_count(device)

    def narrowest(BV, floor):  # halve the column block until there are >= 4 programs per SM
        while BV > floor and s.heads_total * cdiv(s.value_dim, BV) < 4 * sms:
            BV //= 2
        return BV

    if s.tokens >= 64:
        # Streaming prefill: per-token latency. One warp a program, so the key reductions are
        # warp shuffles, and 4 columns a program, so that the most programs run side by side.
        BV = min(BVmax, 4 if s.heads_total * cdiv(s.value_dim, 4) <= 16 * sms else 8)
        return StreamShape(BK, BV, 1, 1, f"streaming prefill: {BV} columns a program, a column's rows over one "
                                         f"warp's lanes (shuffle reductions)")
    if s.key_contiguous:
        # Key rows contiguous: one warp a program, 8 value rows of K keys. The K reductions run
        # along the lanes (shuffles), each load covers whole rows, and the small tiles leave room
        # for many resident warps: the most bytes in flight.
        BV = narrowest(min(BVmax, 8), min(BVmax, 4))
        return StreamShape(BK, BV, 1, 1, f"decode, key-contiguous state: {BV} rows x {BK} keys on one warp "
                                         f"({BV * BK * s.state_bytes // 1024} KB tiles)")
    if s.tokens == 1 and s.state_bytes == 4 and s.heads_total * cdiv(s.value_dim, 64) >= 4 * sms:
        # [K, V] fp32 state, one token, many requests: 64 columns on 4 warps. With one token both
        # key reductions read the same decayed tile side by side, so the cross-warp sums overlap.
        BV = min(BVmax, 64)
        return StreamShape(BK, BV, 4, 1, f"decode of one token, [K, V] state: {BV} columns on 4 warps "
                                         f"({BK * BV * s.state_bytes // 1024} KB tiles)")
    # [K, V] state: a column's K rows must stay within one warp for the reductions to be shuffles,
    # so one warp a program; 32 columns = 128-byte fp32 rows. Below 16 columns is slower.
    BV = narrowest(min(BVmax, 32), min(BVmax, 16))
    return StreamShape(BK, BV, 1, 1, f"decode, [K, V] state: {BV} columns a program on one warp "
                                     f"({BK * BV * s.state_bytes // 1024} KB tiles)")
