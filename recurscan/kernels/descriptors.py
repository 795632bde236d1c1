"""The varlen chunk descriptors formed on the device from ``cu_seqlens`` (the readable form is
``recurscan.descriptors.reference_device_descriptors``; the host-built one
``build_chunk_descriptors``).

Row r of a padded chunk index belongs to the first sequence whose chunk count's prefix sum
(``end_n``) is past r, so with ends non-decreasing:

    sequence(r) = #{n : end_n <= r}          chunk(r) = r - max({end_n : end_n <= r} u {0})

and rows at or past the last end are padding (-1, -1). Zero-length sequences (``end_n`` equal to
the one before) are counted and own no row. Each program takes BLOCK_R rows and walks the
sequences BLOCK_N at a time, the ends of a block their prefix sum plus the blocks' running total.
"""
import triton
import triton.language as tl


@triton.jit
def _index_step(rows, ends, live, seq, start):
    """One block of sequences' share of the two reductions above, for ``rows`` [BLOCK_R]."""
    le = (ends[None, :] <= rows[:, None]) & live[None, :]
    seq += tl.sum(le.to(tl.int32), axis=1)
    start = tl.maximum(start, tl.max(tl.where(le, ends[None, :], 0), axis=1))
    return seq, start


@triton.jit
def chunk_descriptors_kernel(cu, chunk_indices, chunk_indices_dp, chunk_offsets, N, R, R_DP,
                             M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid ``(cdiv(max(R, R_DP), BLOCK_R),)``. ``cu [N + 1]`` int32 / int64; writes
    ``chunk_indices [R, 2]``, ``chunk_indices_dp [R_DP, 2]`` (the stream of M Householder copies;
    not written for M = 1, where it is ``chunk_indices``) and, from program 0, ``chunk_offsets
    [N + 1]``, all int32."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    seq = tl.zeros([BLOCK_R], tl.int32)
    start = tl.zeros([BLOCK_R], tl.int64)
    seq_dp = tl.zeros([BLOCK_R], tl.int32)
    start_dp = tl.zeros([BLOCK_R], tl.int64)
    base = tl.zeros([], tl.int64)
    base_dp = tl.zeros([], tl.int64)
    if pid == 0:
        tl.store(chunk_offsets, 0)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        live = n < N
        lo = tl.load(cu + n, mask=live, other=0).to(tl.int64)
        hi = tl.load(cu + n + 1, mask=live, other=0).to(tl.int64)
        length = tl.maximum(hi - lo, 0)
        ends = base + tl.cumsum((length + CHUNK - 1) // CHUNK, axis=0)
        seq, start = _index_step(rows, ends, live, seq, start)
        tl.store(chunk_offsets + 1 + n, ends.to(tl.int32), mask=live & (pid == 0))
        base = tl.max(tl.where(live, ends, base), axis=0)
        if M > 1:
            ends_dp = base_dp + tl.cumsum((length * M + CHUNK - 1) // CHUNK, axis=0)
            seq_dp, start_dp = _index_step(rows, ends_dp, live, seq_dp, start_dp)
            base_dp = tl.max(tl.where(live, ends_dp, base_dp), axis=0)
    real = rows < base
    tl.store(chunk_indices + 2 * rows, tl.where(real, seq, -1), mask=rows < R)
    tl.store(chunk_indices + 2 * rows + 1, tl.where(real, rows - start, -1).to(tl.int32), mask=rows < R)
    if M > 1:
        real_dp = rows < base_dp
        tl.store(chunk_indices_dp + 2 * rows, tl.where(real_dp, seq_dp, -1), mask=rows < R_DP)
        tl.store(chunk_indices_dp + 2 * rows + 1, tl.where(real_dp, rows - start_dp, -1).to(tl.int32),
                 mask=rows < R_DP)
