"""The scan algebra of seed 001: affine maps, scans, their backward passes, stable segment sums,
the chunkwise algorithm and its cost model.

This is the textbook layer. It imports nothing else from recurscan, so anyone can check it
against the mathematics without reading the rest of the library.
"""
from __future__ import annotations

import torch


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
        >>> segsum(torch.log(torch.tensor([0.5, 0.5, 0.5]))).exp()
        tensor([[1.0000, 0.0000, 0.0000],
                [0.5000, 1.0000, 0.0000],
                [0.2500, 0.5000, 1.0000]])
    """
    T = log_a.shape[-1]
    # Row i of column j holds log_a[i] when i > j; cumulative sums down each column then add
    # exactly the terms j+1..i of that column's segment.
    x = log_a.unsqueeze(-1).expand(*log_a.shape, T)
    strict = torch.tril(torch.ones(T, T, dtype=torch.bool, device=log_a.device), diagonal=-1)
    x = x.masked_fill(~strict, 0)
    out = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=log_a.device), diagonal=0)
    return out.masked_fill(~lower, float("-inf"))
