"""Where the first forward + backward of a delta-rule workload goes, in a fresh process: each
kernel's compile (Triton's compile listener), its start and end on the call's clock, its stages,
and the thread that compiled it; ``--no-load`` leaves each kernel's module load and launcher build
to its first launch (as before 5379261). Run with an empty Triton cache:

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PWD python -m benchmarks.cold_profile gdn_b4_t4096_h16 [--no-load]
"""
from __future__ import annotations

import sys
import threading
import time


def main(name: str, no_load: bool) -> None:
    import torch
    from triton import knobs

    from benchmarks import registry
    from benchmarks.gpu_delta_train import leaves, recurscan_step

    start, compiles = [0.0], []

    def listener(src, metadata, metadata_group, times, cache_hit):
        end = time.perf_counter() - start[0]
        took = (times.ir_initialization + sum(us for _, us in times.lowering_stages) + times.store_results) / 1e6
        stages = " ".join(f"{stage} {us / 1e6:.2f}" for stage, us in times.lowering_stages)
        kernel = getattr(getattr(src, "fn", None), "__name__", str(src)[:40])
        compiles.append((end - took, end, took, times.ir_initialization / 1e6, kernel,
                         threading.current_thread().name, stages))

    knobs.compilation.listener = listener
    if no_load:
        import recurscan.runtime.launcher as launcher
        launcher._load = lambda compiled, device: None
    w = registry.get(name)
    t, x = leaves(w)
    do = torch.randn(w.batch, w.seqlen, w.value_heads, w.head_v, device="cuda", dtype=t["v"].dtype)
    torch.cuda.synchronize()
    start[0] = time.perf_counter()
    o = recurscan_step(w, x, t)
    forward = time.perf_counter() - start[0]
    torch.autograd.grad(o.reshape(do.shape), list(t.values()), do)
    torch.cuda.synchronize()
    total = time.perf_counter() - start[0]
    print(f"{name}{' --no-load' if no_load else ''}: first forward returned at {forward:.2f} s, "
          f"forward + backward {total:.2f} s")
    for began, ended, took, frontend, kernel, thread, stages in sorted(compiles):
        print(f"  {began:6.2f} -> {ended:6.2f} s ({took:5.2f}; frontend {frontend:4.2f})  {kernel:34s} {thread:22s} "
              f"{stages}")


if __name__ == "__main__":
    main(sys.argv[1], "--no-load" in sys.argv[2:])
