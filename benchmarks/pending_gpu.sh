#!/bin/bash
# What waits for the H200, in two calls of under 10 minutes (`bash benchmarks/pending_gpu.sh a`,
# then `... b`; run from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and
# mamba_ssm-2.3.2.post1.tar.gz). Each step has its own time limit so that one hang cannot take the
# others' results; $OUT receives the files.
#
#   1. the traced-scan GPU tests (their compiled backward hung at 59ed760, fixed at b45f472);
#   2. issue 22's plan table (streaming against chunked, predicted against measured);
#   3. (call b) SSD and GLA on the delta sweep: phases beside the prep for SSD B1 (80 programs leave 52 SMs
#      idle), the prep over 16 heads a program, segments since pass 1 stopped sweeping the
#      identity (dc5f86a), the prep's register cap, D per head on aqk's diagonal (56cf1b0); forward
#      + backward with the recompute on the sweep against the fused kernel, beside mamba_ssm;
#   4. (call a) the dense few-pair segment rows of issue 21 (4 x 8192 HV4 dense in one pass 0.319 ms
#      against 0.188 cut as varlen).
set -u
C=${RECURSCAN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
if [ "${1:-a}" = a ]; then
timeout 150 python -m pytest -m gpu -v tests/gpu/test_traced_scan_gpu.py -p no:cacheprovider -o faulthandler_timeout=100 \
    > "$OUT/gpu_tests_traced_$C.log" 2>&1; echo "traced rc=$?"; grep -E "PASSED|FAILED|Timeout" "$OUT/gpu_tests_traced_$C.log" | head
timeout 200 env PYTHONPATH=$PWD python benchmarks/gpu_plan_table.py --out "$OUT/gpu_plan_table_$C.json" \
    > "$OUT/plan_table_$C.log" 2>&1; echo "plan rc=$?"; tail -20 "$OUT/plan_table_$C.log"
timeout 60 env PYTHONPATH=$PWD python benchmarks/gpu_varlen_segments.py --skip-varlen --dense-segments 3 \
    --dense-segments 4 --out "$OUT/gpu_dense_segments_$C.json" 2>&1 | tail -12
else
timeout 420 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile \
    --sweep 64:4:3:tma:ph6 --sweep 64:4:3:tma:ph8 --sweep 64:4:3:tma:h16 --sweep 64:4:3:tma:ph6:h16 \
    --sweep 64:4:3:tma:seg2 --sweep 64:4:3:tma:seg3 --sweep 64:4:3:reg128 --sweep 64:4:3:h4 --train \
    --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -60
fi
