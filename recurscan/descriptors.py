"""Chunk descriptors for varlen chunked prefill: built once per step on the host, or formed on
the device by the op that is called without them.

A varlen call needs, per step, three small index tensors:

- ``chunk_indices [NT_pad, 2]`` int32: (sequence, chunk) for every 64-token chunk of the token
  stream, sequence-major; rows past the real ones are ``(-1, -1)``.
- ``chunk_indices_dp [NT_dp_pad, 2]`` int32: the same for the Householder-expanded stream, whose
  sequences are M times longer. Not a rescaling of ``chunk_indices``: a sequence of L tokens has
  ``ceil(L*M/64)`` expanded chunks, not ``M*ceil(L/64)``. For M = 1 it is ``chunk_indices``.
- ``chunk_offsets [N + 1]`` int32: prefix sums of the token-stream chunk counts; row
  ``chunk_offsets[n] + c`` of the chunk-state tensor is sequence n's state entering its chunk c.

Exact lengths would be data-dependent and size the launch grids. Padded to a length that depends
only on (total tokens, number of sequences), they keep every grid and every allocation fixed for a
captured batch shape: the op then never synchronises and can be replayed from a CUDA graph. Built
on the host (:func:`build_chunk_descriptors`, which checks the boundaries' values), or formed where
``cu_seqlens`` lives by tensor operations of those fixed shapes
(``launch.descriptors.device_descriptors``, what a GPU call without descriptors does: no host
read).

Padding bound: sum_n ceil(L_n / 64) <= floor(T / 64) + N for sum_n L_n = T (each sequence adds at
most one partial chunk), so ``NT_pad = T // 64 + N`` and ``NT_dp_pad = T*M // 64 + N``.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple, Sequence

import numpy as np
import torch

CHUNK_SIZE = 64


class ChunkDescriptors(NamedTuple):
    """The three descriptors, padded to fixed lengths (see the module docstring)."""

    chunk_indices: torch.Tensor  # [T // 64 + N, 2] int32
    chunk_indices_dp: torch.Tensor  # [T*M // 64 + N, 2] int32
    chunk_offsets: torch.Tensor  # [N + 1] int32

    def as_kwargs(self) -> dict:
        """Keyword arguments for ``recurscan.chunk_gated_delta_product_varlen`` (and, without
        ``chunk_indices_dp``, for ``recurscan.chunk_gated_delta_rule``)."""
        return dict(chunk_indices=self.chunk_indices, chunk_indices_dp=self.chunk_indices_dp,
                    chunk_offsets=self.chunk_offsets)


def _is_int(value) -> bool:
    """A Python or NumPy integer; never a bool (True is not a length)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(name: str, value, minimum: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def _lengths(cu_seqlens) -> list[int]:
    """Sequence lengths from ``[N + 1]`` boundaries: a list or tuple of ints, or a 1-D int32 /
    int64 tensor on any device."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens: expected an int32 or int64 tensor, got "
                            f"{str(cu_seqlens.dtype).replace('torch.', '')}")
        if cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens: expected a 1-D tensor [N + 1], got shape {list(cu_seqlens.shape)}")
        bounds = cu_seqlens.detach().to("cpu").tolist()  # a CUDA tensor syncs here: once per step
    elif isinstance(cu_seqlens, (list, tuple)):
        for i, b in enumerate(cu_seqlens):
            if not _is_int(b):
                raise TypeError(f"cu_seqlens: expected integer boundaries, got {b!r} ({type(b).__name__}) "
                                f"at position {i}")
        bounds = [int(b) for b in cu_seqlens]
    else:
        raise TypeError(f"cu_seqlens: expected a list or tuple of ints or a 1-D int32/int64 tensor, "
                        f"got {type(cu_seqlens).__name__}")
    if len(bounds) < 2 or bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing boundaries starting at 0, got {bounds}")
    return [b - a for a, b in zip(bounds, bounds[1:])]


def chunk_pairs(lengths: Sequence[int], chunk_size: int = CHUNK_SIZE) -> list[tuple[int, int]]:
    """The real rows of a chunk index: (sequence, chunk) for every chunk of every sequence of
    ``lengths``, sequence-major."""
    return [(n, c) for n, L in enumerate(lengths) for c in range(-(-L // chunk_size))]


def chunk_offsets_of(lengths: Sequence[int], chunk_size: int = CHUNK_SIZE) -> list[int]:
    """``[N + 1]`` prefix sums of the sequences' chunk counts (the values of ``chunk_offsets``)."""
    offsets = [0]
    for L in lengths:
        offsets.append(offsets[-1] - (-L // chunk_size))
    return offsets


def _indices(lengths: Sequence[int], chunk_size: int, rows: int) -> torch.Tensor:
    """:func:`chunk_pairs` as an int32 ``[rows, 2]`` tensor padded with (-1, -1), formed with array
    operations: its host time does not grow with the chunk count as a list of pairs does
    (benchmarks/cpu_descriptors.py)."""
    counts = -(-np.asarray(lengths, dtype=np.int64) // chunk_size)
    real = int(counts.sum())
    if real > rows:
        raise ValueError(f"max_tokens: the sequences need {real} chunks, more than the padded {rows}")
    out = np.full((rows, 2), -1, dtype=np.int32)
    out[:real, 0] = np.repeat(np.arange(len(lengths)), counts)
    out[:real, 1] = np.arange(real) - np.repeat(np.cumsum(counts) - counts, counts)
    return torch.from_numpy(out)


def descriptors_for_call(cu_seqlens: torch.Tensor, num_householder: int = 1, *, device=None,
                         op: str = "this op") -> ChunkDescriptors:
    """The descriptors a varlen call without them derives: one host read of ``cu_seqlens`` (a
    synchronisation), then :func:`build_chunk_descriptors`. Refused while a CUDA graph is being
    captured, where neither that read nor the descriptors' upload can happen (torch would fail with
    "Cannot copy between CPU and CUDA tensors during CUDA graph capture"): build them before the
    capture and pass them."""
    refuse_under_capture(op)
    return build_chunk_descriptors(cu_seqlens, num_householder, device=device)


def padded_descriptors(cu_host: torch.Tensor, num_householder: int, *, tokens: int,
                       device=None) -> tuple[ChunkDescriptors, int]:
    """The descriptors of the (validated, host) boundaries ``cu_host``, padded to ``tokens`` (the
    call's T), so that they have the shapes of every other batch of that many tokens and the
    launches kept for a call's signature serve a call that derived them as one given them; and the
    exact count of token chunks (what a call's chunk states are trimmed to)."""
    lengths = _lengths(cu_host)
    return (build_chunk_descriptors(cu_host, num_householder, max_tokens=tokens, device=device),
            chunk_offsets_of(lengths)[-1])


def _device_indices(lengths: torch.Tensor, chunk_size: int, rows: int) -> torch.Tensor:
    """:func:`_indices` from lengths on any device, by tensor operations of fixed shapes: sequence
    ``n`` owns rows ``[ends[n] - counts[n], ends[n])``, so a row's sequence is the first ``n`` whose
    end is past it (zero-length sequences own no row); rows past the last end are (-1, -1)."""
    counts = (lengths + chunk_size - 1).div(chunk_size, rounding_mode="floor")
    ends = counts.cumsum(0)
    row = torch.arange(rows, device=lengths.device, dtype=ends.dtype)
    seq = torch.searchsorted(ends, row, right=True).clamp_(max=lengths.numel() - 1)
    chunk = row - (ends - counts)[seq]
    real = row < ends[-1]
    return torch.stack((torch.where(real, seq, -1), torch.where(real, chunk, -1)), 1).to(torch.int32)


def reference_device_descriptors(cu_seqlens: torch.Tensor, num_householder: int, *, tokens: int,
                                 chunk_size: int = CHUNK_SIZE) -> ChunkDescriptors:
    """``launch.descriptors.device_descriptors`` by PyTorch operations of fixed shapes (the readable
    form of the Triton kernel, ``recurscan/kernels/descriptors.py``; the form taken on the CPU)."""
    cu = cu_seqlens.detach().to(torch.int64)
    lengths = (cu[1:] - cu[:-1]).clamp_(min=0)
    N, M = lengths.numel(), num_householder
    chunk_indices = _device_indices(lengths, chunk_size, padded_chunk_count(tokens, N, 1, chunk_size))
    chunk_indices_dp = chunk_indices if M == 1 else \
        _device_indices(lengths * M, chunk_size, padded_chunk_count(tokens, N, M, chunk_size))
    counts = (lengths + chunk_size - 1).div(chunk_size, rounding_mode="floor")
    offsets = torch.cat((counts.new_zeros(1), counts.cumsum(0))).to(torch.int32)
    return ChunkDescriptors(chunk_indices, chunk_indices_dp, offsets)


def refuse_under_capture(op: str) -> None:
    """The error of a varlen call without descriptors inside a CUDA graph capture (above)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError(f"cu_seqlens: {op} was called without chunk_indices / chunk_offsets while a CUDA graph is "
                         "being captured; deriving them reads cu_seqlens on the host, which a capture cannot do. "
                         "Build them before the capture with recurscan.build_chunk_descriptors(cu_seqlens, "
                         "num_householder) and pass them (.as_kwargs())")


def padded_chunk_count(total_tokens: int, num_sequences: int, num_householder: int = 1,
                       chunk_size: int = CHUNK_SIZE) -> int:
    """The fixed length of ``chunk_indices`` (M = 1) or ``chunk_indices_dp`` for a batch shape."""
    _check_int("total_tokens", total_tokens, 0)
    _check_int("num_sequences", num_sequences, 0)
    _check_int("num_householder", num_householder, 1)
    _check_int("chunk_size", chunk_size, 1)
    return total_tokens * num_householder // chunk_size + num_sequences


def build_chunk_descriptors(cu_seqlens, num_householder: int = 1, *, max_tokens: int | None = None,
                            chunk_size: int = CHUNK_SIZE, device=None) -> ChunkDescriptors:
    """Build the varlen descriptors for one step, padded to fixed lengths.

    Args:
        cu_seqlens: ``[N + 1]`` sequence boundaries on the token stream, non-decreasing from 0:
            a list or tuple of ints, or a 1-D int32 / int64 tensor (a CUDA tensor is read on the
            host, one synchronisation per step: pass a CPU copy to avoid it). Zero-length
            sequences are allowed (padding entries of a captured batch).
        num_householder: M, an int >= 1 (1 for Gated DeltaNet).
        max_tokens: the token count T (an int >= ``cu_seqlens[-1]``) the padded lengths are
            computed for (default ``cu_seqlens[-1]``); give the captured batch's T so that every
            step has one shape.
        chunk_size: 64 (the kernels' chunk); any int >= 1.
        device: where the tensors go (the op's device).

    Returns:
        :class:`ChunkDescriptors` (int32 tensors on ``device``).

    Raises:
        TypeError: an argument of the wrong type (a float or bool boundary, a string, a float
            tensor; a non-int num_householder, max_tokens or chunk_size).
        ValueError: a value out of range (boundaries not non-decreasing from 0, a tensor not 1-D,
            num_householder or chunk_size < 1, max_tokens negative or fewer than the tokens).

    Example:
        >>> from recurscan import build_chunk_descriptors
        >>> d = build_chunk_descriptors([0, 1, 70, 70, 200], num_householder=3)
        >>> d.chunk_offsets.tolist()
        [0, 1, 3, 3, 6]
        >>> d.chunk_indices.shape, d.chunk_indices_dp.shape   # 200//64 + 4, 600//64 + 4
        (torch.Size([7, 2]), torch.Size([13, 2]))
        >>> d.chunk_indices_dp[:6].tolist()   # lengths 3, 207, 0, 390 on the expanded stream
        [[0, 0], [1, 0], [1, 1], [1, 2], [1, 3], [3, 0]]
    """
    num_householder = _check_int("num_householder", num_householder, 1)
    chunk_size = _check_int("chunk_size", chunk_size, 1)
    if max_tokens is not None:
        max_tokens = _check_int("max_tokens", max_tokens, 0)
    lengths = _lengths(cu_seqlens)
    total = sum(lengths)
    T = total if max_tokens is None else max_tokens
    if T < total:
        raise ValueError(f"max_tokens: {T} is fewer than the {total} tokens of cu_seqlens")
    N, M = len(lengths), num_householder
    chunk_indices = _indices(lengths, chunk_size, padded_chunk_count(T, N, 1, chunk_size))
    if M == 1:
        chunk_indices_dp = chunk_indices
    else:
        chunk_indices_dp = _indices([L * M for L in lengths], chunk_size, padded_chunk_count(T, N, M, chunk_size))
    offsets = chunk_offsets_of(lengths, chunk_size)
    chunk_indices = chunk_indices.to(device)
    chunk_indices_dp = chunk_indices if M == 1 else chunk_indices_dp.to(device)
    return ChunkDescriptors(chunk_indices, chunk_indices_dp, torch.tensor(offsets, dtype=torch.int32, device=device))
