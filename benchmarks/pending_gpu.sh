#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. Nothing built waits for its first GPU run (the GLA reverse sweep's and dg launch's Gluon
#      twins ran and are planned at c5fc8a6). The check of record: SSD's and simple GLA's rows with
#      the reverse sweep and the dg launch each on the kernel not planned beside the planned
#      (--reverse-twin --dg-twin), mamba_ssm and fla in the same process, GPU time by kernel;
#   1. the whole GPU suite (157 passed at c5fc8a6).
set -u
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 300 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-twin --dg-twin --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
