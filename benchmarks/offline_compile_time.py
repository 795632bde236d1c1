"""Compile time for sm_90, with no GPU, of the kernels a backward's first call compiles (its
forward recompute's and its stages', as tests/helpers/sm90.py builds them): one after the other,
or each in a thread of its own (what ``runtime.launcher.compile_in_background`` does on a first
call; Triton's compiler and ptxas run outside Python's lock). Each mode in a fresh process with an
empty cache:

    TRITON_CACHE_DIR=$(mktemp -d) python -m benchmarks.offline_compile_time seq ["GDN dense, H = HV" "Gluon dq and dk"]
    TRITON_CACHE_DIR=$(mktemp -d) python -m benchmarks.offline_compile_time par

The case and the backward shape are names of ``tests.helpers.sm90.CASES`` and ``SHAPES``. The
kernels' own times in turn are printed too (``seq``).
"""
import sys
import threading
import time

from tests.helpers import sm90


def main(mode: str, case: str, shape: str) -> None:
    launches = sm90.case_launches(case, shape)
    t = time.perf_counter()
    if mode == "seq":
        for step, names, values in launches:
            t1 = time.perf_counter()
            sm90.compile_for_sm90(step, names, values)
            print(f"  {time.perf_counter() - t1:5.2f} s  {getattr(step.kernel, 'fn', step.kernel).__name__}")
    else:
        threads = [threading.Thread(target=sm90.compile_for_sm90, args=launch) for launch in launches]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    print(f"{mode}: {len(launches)} kernels ({case}, {shape}) compiled in {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    args = sys.argv[1:] + [None] * 3
    main(args[0] or "seq", args[1] or "GDN dense, H = HV", args[2] or "Gluon dq and dk")
