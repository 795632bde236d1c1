"""The launch of the device-side descriptor kernel (kernels/descriptors.py): one int32 buffer
holding the three descriptors (each part 16-byte aligned), and the compiled kernel launched
directly for a signature seen before (runtime/launcher.py), so that a varlen call without
descriptors pays one allocation and one launch for them."""
from __future__ import annotations

import torch
import triton

from ..descriptors import CHUNK_SIZE, ChunkDescriptors, padded_chunk_count, reference_device_descriptors
from ..kernels.descriptors import chunk_descriptors_kernel
from ..runtime.cache import SignatureCache, launch_key
from ..runtime.launcher import CallArg, jit_launch

#: Rows a program takes, and sequences compared with them a step ([BLOCK_R, BLOCK_N] a step).
BLOCK_R, BLOCK_N = 256, 32
_NAMES = ("cu", "chunk_indices", "chunk_indices_dp", "chunk_offsets")
#: (cu's signature, M, tokens) -> the DirectLaunch of that signature (None: launched through the JIT).
LAUNCHES = SignatureCache("varlen descriptors")


def _aligned(n: int) -> int:
    return -(-n // 4) * 4  # int32 entries to a multiple of 16 bytes


def form_descriptors(cu_seqlens: torch.Tensor, num_householder: int, tokens: int) -> ChunkDescriptors:
    """:func:`device_descriptors` by the Triton kernel: the same tensors."""
    cu = cu_seqlens.detach().contiguous()
    N, M = cu.numel() - 1, num_householder
    R, R_dp = padded_chunk_count(tokens, N, 1), padded_chunk_count(tokens, N, M)
    dp_at = _aligned(2 * R)
    off_at = dp_at + (_aligned(2 * R_dp) if M > 1 else 0)
    buf = torch.empty(off_at + N + 1, dtype=torch.int32, device=cu.device)
    chunk_indices = buf[:2 * R].view(R, 2)
    chunk_indices_dp = chunk_indices if M == 1 else buf[dp_at:dp_at + 2 * R_dp].view(R_dp, 2)
    chunk_offsets = buf[off_at:]
    values = (cu, chunk_indices, chunk_indices_dp, chunk_offsets)
    key = (launch_key((cu,)), M, tokens)
    direct = LAUNCHES.get(key)
    if direct is not None:
        direct(values)
    else:
        grid = (triton.cdiv(max(R, R_dp, 1), BLOCK_R),)
        kwargs = dict(zip(_NAMES, map(CallArg, _NAMES)), N=N, R=R, R_DP=R_dp, M=M, CHUNK=CHUNK_SIZE,
                      BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N)
        direct = jit_launch(chunk_descriptors_kernel, grid, kwargs, dict(num_warps=4), _NAMES, values)
        if direct is not None:
            LAUNCHES.put(key, direct)
    return ChunkDescriptors(chunk_indices, chunk_indices_dp, chunk_offsets)


def device_descriptors(cu_seqlens: torch.Tensor, num_householder: int, *, tokens: int) -> ChunkDescriptors:
    """The descriptors of ``cu_seqlens`` padded to ``tokens`` (the call's T), formed where
    ``cu_seqlens`` lives with no host read: no synchronisation, and a CUDA graph captures them. What
    a varlen call on a GPU without descriptors derives; for valid boundaries the tensors of
    ``build_chunk_descriptors(cu_seqlens, num_householder, max_tokens=tokens)``
    (``tests/test_descriptors.py``). On CUDA one Triton kernel forms them (:func:`form_descriptors`:
    one allocation and one launch, where PyTorch operations took ~0.6 ms of host time on the
    H200's host); elsewhere ``descriptors.reference_device_descriptors``. The boundaries' values
    are not checked (a host read would be needed): as with descriptors given on a GPU, the kernels bound
    every index, so wrong boundaries give wrong numbers and never an access outside a tensor
    (``RECURSCAN_CHECK=1`` checks them)."""
    if cu_seqlens.is_cuda:
        return form_descriptors(cu_seqlens, num_householder, tokens)
    return reference_device_descriptors(cu_seqlens, num_householder, tokens=tokens)
