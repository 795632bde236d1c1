#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The GLA backward's reverse sweep as its Gluon twin (kernels/gluon/gla_backward_sweep.py,
#      built without a GPU run; plan.gla.GLUON_GLA_REVERSE_SWEEP off): its GPU tests (the Triton
#      kernel's gradients bit for bit at 64 value columns on 4 warps; the oracle at the benchmark's
#      size), then SSD's training rows with it (--reverse-twin) and with the Triton kernel at 64
#      columns on 8 warps (--reverse-sweep 64:8: no spills offline, one program an SM) beside the
#      planned (3.384 / 2.925 ms at 5d25e3f; the reverse sweep 948 / 626 us); and SSD B1's forward
#      with segments on the group prep's twin (pass 1 the Triton kernel's, pass 2 the twin's: 160
#      programs against 80; docs/kernels-gla-plan.md, "The next GPU session"), beside the planned
#      one pass (0.484 ms at 5d25e3f), mamba_ssm and fla in the same process, GPU time by kernel;
#   1. the host time of a small call: simple GLA B4 T4096's forward issued 100 times without a
#      sync, and its Python functions by time (0.208 ms of wall time for 0.153 of GPU time at
#      5d25e3f);
#   2. the whole GPU suite (142 passed at 78bb842; the GLA files 46 passed at 9d088a5).
set -u
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 150 python -m pytest -m gpu tests/gpu/test_gluon_gla_sweep_gpu.py -p no:cacheprovider -q -k reverse 2>&1 | tail -4
timeout 240 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-twin --reverse-sweep 64:8 --sweep 64:4:2:seg2:tma:grp:gluon --sweep 64:4:2:seg3:tma:grp:gluon \
    --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
timeout 60 env PYTHONPATH=$PWD python - <<'PY' 2>&1 | tail -24
import cProfile, pstats, time, torch, recurscan
q, k, v = (torch.randn(4, 4096, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
g = -torch.rand(4, 4096, 16, device="cuda")
call = lambda: recurscan.chunk_simple_gla(q, k, v, g, scale=128 ** -0.5)
for _ in range(5):
    call()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(100):
    call()
host = (time.perf_counter() - t) / 100
torch.cuda.synchronize()
print(f"simple GLA B4 T4096: host {host * 1e6:.1f} us a call; with the GPU {(time.perf_counter() - t) * 1e4:.1f}")
cProfile.run("for _ in range(200): call()", "/tmp/host.prof")
pstats.Stats("/tmp/host.prof").sort_stats("tottime").print_stats(15)
PY
timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
