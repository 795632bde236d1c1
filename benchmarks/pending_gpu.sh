#!/bin/bash
# What waits for the H200, in one call of under 10 minutes (`bash benchmarks/pending_gpu.sh`, from
# the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and
# mamba_ssm-2.3.2.post1.tar.gz). Each step has its own time limit so that one hang cannot take the
# others' results; $OUT receives the files.
#
#   1. chunk_gla (a decay per key) on the per-key prep and the delta sweep (KEY_DECAY) against the
#      fused kernel and fla, with GPU time by kernel; its forward + backward;
#   2. the GLA / SSD rows with the planner's rows (SSD B1 now in 6 phases);
#   3. the dense few-pair GDN rows, now planned in 4 segments;
#   4. the whole GPU suite (the streaming choice of chunk_gated_delta_rule, the per-key sweep).
set -u
C=${RECURSCAN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 120 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_gla.py --only-per-key --profile \
    --out "$OUT/gpu_gla_per_key_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -12
timeout 150 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile \
    --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -12
timeout 60 env PYTHONPATH=$PWD python benchmarks/gpu_varlen_segments.py --skip-varlen --dense-segments 3 \
    --out "$OUT/gpu_dense_segments_$C.json" 2>&1 | tail -9
timeout 230 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=200 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -15
