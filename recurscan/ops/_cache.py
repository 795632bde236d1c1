"""The in-place state cache shared by every family (decode and chunked prefill alike).

A cache ``state [S, ...]`` is addressed by ``state_indices [N]``: sequence n reads and writes slot
``state_indices[n]``; -1 marks a padding request, whose output is zero and whose slot is never
read or written. These helpers serve the PyTorch backend; Triton kernels do the same in-kernel.
"""
from __future__ import annotations

import torch


def gather(state: torch.Tensor, state_indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Initial states ``[N, ...]`` from the cache; padding rows are zeros (their slot is not read)."""
    live = state_indices >= 0
    out = torch.zeros(state_indices.shape[0], *state.shape[1:], dtype=dtype, device=state.device)
    out[live] = state[state_indices[live].long()].to(dtype)
    return out


def scatter(state: torch.Tensor, state_indices: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows [N, ...]`` back into the cache at the live slots, in place."""
    live = state_indices >= 0
    state[state_indices[live].long()] = rows[live].to(state.dtype)


def padding_token_mask(state_indices: torch.Tensor, batch: int, length: int,
                       cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` True on the tokens of padding sequences (their outputs are zeroed)."""
    pad = state_indices < 0
    if cu_seqlens is None:
        return pad[:, None].expand(batch, length)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(pad, lengths, output_size=length)[None]


def zero_padding_rows(chunk_states: torch.Tensor, state_indices: torch.Tensor, batch: int, length: int,
                      cu_seqlens: torch.Tensor | None, chunk_size: int) -> torch.Tensor:
    """Zero the chunk-state rows ``[NT, ...]`` that belong to padding sequences."""
    if cu_seqlens is None:
        lengths = torch.full((batch,), length, dtype=torch.long, device=state_indices.device)
    else:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    per_sequence = (lengths + chunk_size - 1) // chunk_size
    pad_rows = torch.repeat_interleave(state_indices < 0, per_sequence, output_size=chunk_states.shape[0])
    return chunk_states.masked_fill(pad_rows.view(-1, *[1] * (chunk_states.dim() - 1)), 0)
