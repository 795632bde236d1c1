#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   1. SSD's cold first call, the parallel stage summing a group's heads and one value head a
#      program alternating (benchmarks/gpu_gla_cold_ab.py; 10.9 s at 2c065f5, target 10 s);
#   2. the GLA / SSD forward and training rows as planned, with the delta prep's training rows
#      and dq and dk in launches of their own (plan.gla.GROUP_GRADS_SIDES, not yet measured)
#      beside, mamba_ssm and fla in the same process, GPU time by kernel (the next kernel change's
#      before-and-after);
#   3. the whole GPU suite.
set -u
C=${RECURSCAN_COMMIT:-unknown}
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 90 env PYTHONPATH=$PWD python benchmarks/gpu_gla_cold_ab.py 2>&1 | tail -6
timeout 220 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --grads-sides 4 --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | tail -16
timeout 280 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=270 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
