"""Host time of deriving the varlen descriptors (what a call without them pays on the host, after
its read of cu_seqlens): ``build_chunk_descriptors`` as it is (the chunk index by array operations),
against the chunk index formed as a list of (sequence, chunk) pairs (``descriptors.chunk_pairs``,
the readable form and how it was built before), in one process.

    python benchmarks/cpu_descriptors.py --out benchmarks/results/cpu_descriptors.json
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks import runner
from recurscan.descriptors import build_chunk_descriptors, chunk_offsets_of, chunk_pairs, padded_chunk_count

SHAPES = {"gdp_m2_b4_t4096": ([4096] * 4, 2), "gdn_b1_t16384": ([16384], 1), "gdp_m2_b1_t65536": ([65536], 2)}


def as_list_of_pairs(lengths, M):
    """The three descriptors with each chunk index a list of pairs made into a tensor."""
    T, N = sum(lengths), len(lengths)

    def index(lens, rows):
        pairs = chunk_pairs(lens)
        return torch.tensor(pairs + [(-1, -1)] * (rows - len(pairs)), dtype=torch.int32).reshape(rows, 2)

    ci = index(lengths, padded_chunk_count(T, N, 1))
    dp = ci if M == 1 else index([L * M for L in lengths], padded_chunk_count(T, N, M))
    return ci, dp, torch.tensor(chunk_offsets_of(lengths), dtype=torch.int32)


def median_us(fn, reps=200):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for name, (lengths, M) in SHAPES.items():
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
        now = median_us(lambda: build_chunk_descriptors(cu, M))
        pairs = median_us(lambda: as_list_of_pairs(lengths, M))
        rows.append(dict(workload=name, array_ops_us=now, list_of_pairs_us=pairs))
        print(f"{name:<20} array operations {now:7.1f} us   list of pairs {pairs:7.1f} us", flush=True)
    if args.out:
        runner.save_rows(rows, args.out, torch.device("cpu"))


if __name__ == "__main__":
    main()
