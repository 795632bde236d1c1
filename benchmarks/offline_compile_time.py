"""Compile time of the chunked sweep and its REPLAY variant for sm_90, with no GPU: one after the
other, or together in two threads (what ``runtime.launcher.compile_together`` does on a first
call). Run each mode in a fresh process with an empty cache:

    TRITON_CACHE_DIR=$(mktemp -d) python -m benchmarks.offline_compile_time seq
    TRITON_CACHE_DIR=$(mktemp -d) python -m benchmarks.offline_compile_time par
"""
import sys
import threading
import time

import triton.language as tl

from recurscan.kernels.delta.sweep import chunk_delta_sweep_kernel

from . import sm90_resources as r


def sweep(replay: bool, stages: int, bv: int = 64):
    p, f = "*bf16", "*fp32"
    sig = dict(q=p, k=p, v=p, wy=p, aqk=p, coef=f, o=p, h0=f, ht=f, state=f, state_indices="*i32", chunk_states=f,
               cu_seqlens="*i32", chunk_offsets="*i32", sequence_order="*i32", seg_n=f, seg_m=f, n_seg="i32",
               seg_chunks="i32", tc_first="i32", tc_count="i32", trigger_dependents="i32", T="i32",
               s0_n="i32", s0_h="i32", s0_k="i32", n_slots="i32", n_cs_rows="i32", replay_flags="*i32",
               u_out=p, ks_out=f)
    const = dict(r.SHAPES, V=128, BV=bv, s0_v=1, IS_VARLEN=False, HAS_H0=False, STORE_FINAL=True, USE_CACHE=False,
                 STORE_CHUNK_STATES=False, DOT_PRECISION="tf32", NUM_STAGES=stages, DT=tl.bfloat16, PASS=0,
                 V_PRODUCT=True, TMA_STORE=True, PDL=True, REPLAY=replay, OUTPUTS=True)
    return r._compile(chunk_delta_sweep_kernel, sig, const, 4, stages)


def main(mode: str) -> None:
    sweep(False, 2, 16)  # imports and the compiler's first use, outside the timing
    t = time.perf_counter()
    if mode == "seq":
        sweep(False, 3)
        sweep(True, 1)
    else:
        th = threading.Thread(target=sweep, args=(True, 1))
        th.start()
        sweep(False, 3)
        th.join()
    print(f"{mode}: sweep and replay compiled in {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "seq")
