#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. Nothing built waits for its first GPU run: nothing is pending beyond what the next session
#      adds (the dg twin's sums over rows in one reduction lost at fe4bb86 and was removed; the
#      recompute beside the reverse sweep is planned, plan.gla.GLA_BACKWARD_CORUN 1.0). The check
#      of record: the dg twin's and the corun's GPU tests, then the forward and training rows beside
#      mamba_ssm and fla in the same process, SSD's also with the reverse sweep and the dg launch
#      each on the kernel not planned (--reverse-twin --dg-twin), GPU time by kernel;
#   1. the whole GPU suite (162 passed at fe4bb86).
set -u
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 150 python -m pytest -m gpu tests/gpu/test_gluon_gla_dg_gpu.py tests/gpu/test_gla_gpu.py -k "dg or beside" \
    -p no:cacheprovider -q --tb=short 2>&1 | tail -15
timeout 300 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-twin --dg-twin --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
