#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   1. chunk_gla forward + backward with the backward's calm path (cdc1d78's call lost the row to
#      its time limit: the backward compiles on the first call), with GPU time by kernel;
#   2. the GLA / SSD training rows with the backward's recompute on the delta sweep planned (66ee147),
#      SSD B4 among them, beside mamba_ssm;
#   3. the whole GPU suite.
set -u
C=${RECURSCAN_COMMIT:-unknown}
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 200 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_gla.py --only-per-key --profile \
    --out "$OUT/gpu_gla_per_key_train_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -6
timeout 280 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --train \
    --out "$OUT/gpu_gla_sweep_train_$C.json" 2>&1 | grep -v Warning | tail -16
timeout 220 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=180 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
