"""Shared pieces of the CPU oracle: sequence boundaries, head grouping, chunk bookkeeping.

Every family's reference follows one pattern:

    for each sequence (a batch row, or a cu_seqlens segment):
        state = its initial state (zeros if none)
        naive:   for each token:        state = step(state, token)      -> output row
        chunked: for each chunk window: state = chunk(state, window)    -> output rows

so the chunked form is a chunk-window decomposition (each window continues from the
previous window's state), its memory is one window plus one state, and it has no length ceiling.
"""
from __future__ import annotations

import math
from typing import Iterator, NamedTuple

import torch

from ..descriptors import CHUNK_SIZE  # noqa: F401  (the oracle's default window, the kernels' chunk)


class Segment(NamedTuple):
    """One sequence: batch row ``b`` of the inputs, tokens ``start:end`` along time."""

    index: int  # sequence number n: row of initial/final state, of state_indices
    b: int
    start: int
    end: int


def sequences(batch: int, length: int, cu_seqlens: torch.Tensor | None) -> list[Segment]:
    """The sequences of a ``[B, T, ...]`` input: B rows, or the cu_seqlens segments of row 0."""
    if cu_seqlens is None:
        return [Segment(b, b, 0, length) for b in range(batch)]
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return [Segment(n, 0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]


class SequenceBlock(NamedTuple):
    """Sequences the oracle advances together, because they share their token range.

    ``rows`` are batch rows of the inputs, ``start:end`` the tokens along time, ``seqs`` the
    matching rows of the state tensors (sequence numbers n). Slices, so indexing gives views.
    """

    rows: slice
    seqs: slice
    start: int
    end: int

    @property
    def sequence_numbers(self) -> range:
        return range(self.seqs.start, self.seqs.stop)


def sequence_blocks(batch: int, length: int, cu_seqlens: torch.Tensor | None) -> list[SequenceBlock]:
    """All B rows at once (equal lengths), or one cu_seqlens segment at a time (row 0).

    Example:
        >>> import torch
        >>> from recurscan.reference.common import sequence_blocks
        >>> sequence_blocks(2, 5, None)
        [SequenceBlock(rows=slice(0, 2, None), seqs=slice(0, 2, None), start=0, end=5)]
        >>> sequence_blocks(1, 5, torch.tensor([0, 1, 5]))[1]
        SequenceBlock(rows=slice(0, 1, None), seqs=slice(1, 2, None), start=1, end=5)
    """
    if cu_seqlens is None:
        return [SequenceBlock(slice(0, batch), slice(0, batch), 0, length)]
    segments = sequences(batch, length, cu_seqlens)
    return [SequenceBlock(slice(s.b, s.b + 1), slice(s.index, s.index + 1), s.start, s.end) for s in segments]


def num_chunks(length: int, chunk_size: int = CHUNK_SIZE) -> int:
    return math.ceil(length / chunk_size)


def chunk_offsets(segments: list[Segment], chunk_size: int = CHUNK_SIZE) -> list[int]:
    """Prefix sums of per-sequence chunk counts: row ``offsets[n] + c`` of a chunk-state tensor is
    sequence n's state entering its chunk c (after its first ``chunk_size * c`` tokens)."""
    offsets = [0]
    for seg in segments:
        offsets.append(offsets[-1] + num_chunks(seg.end - seg.start, chunk_size))
    return offsets


def windows(length: int, chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[int, int]]:
    """The chunk windows ``(start, end)`` of a sequence of ``length`` tokens; the last may be short."""
    for start in range(0, length, chunk_size):
        yield start, min(start + chunk_size, length)


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 if any input is float64, else float32: the oracle never computes below float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension (fla's in-kernel L2 norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def causal_matmul(P: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """``P @ X`` over a window's tokens, causal even where ``X`` is not finite.

    ``P [..., C, C]`` is lower triangular with exact zeros above the diagonal (a masked score
    matrix: row i reads tokens j <= i); ``X [..., C, D]`` has one row per token and independent
    columns. A plain product is not causal under non-finite input: row i < t multiplies a NaN or
    inf ``X[t]`` by its exact zero ``P[i, t]`` and gets NaN (0 * NaN = NaN). So rows before the
    first non-finite entry of a column take the product with non-finite entries replaced by 0
    (0 * finite adds an exact zero: the clean run's bits), and rows at or after it take the plain
    product, which is non-finite there (a NaN is never hidden). Both products are computed and
    selected, so nothing is read back on the host.

    Example:
        >>> import torch
        >>> from recurscan.reference.common import causal_matmul
        >>> P = torch.tril(torch.ones(3, 3))
        >>> causal_matmul(P, torch.tensor([[1.0], [float("nan")], [2.0]])).flatten().tolist()
        [1.0, nan, nan]
    """
    finite = torch.isfinite(X)
    poisoned = (~finite).cumsum(dim=-2) > 0  # [..., C, D]: a non-finite X[j, d] with j <= i
    return torch.where(poisoned, P @ X, P @ torch.where(finite, X, 0))


def repeat_heads(x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """Grouped value attention: head ``hv`` reads query/key head ``hv // (heads // H)``."""
    groups = heads // x.shape[dim]
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)
