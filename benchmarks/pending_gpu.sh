#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The dg twin's sums over rows in one reduction (SUMS_TOGETHER, built offline at the end of
#      session 23: 25 barriers a head against 40; plan.gla.GLUON_GLA_DG_SUMS_TOGETHER off): its GPU
#      tests (dg against the Triton kernel within float32 rounding, both forms), then SSD's training
#      rows with it (--dg-sums-together) beside the planned (B1 2.897 / B4 2.536 ms at c5fc8a6; the
#      dg twin 674 / 667 us), and with the reverse sweep and the dg launch each on the kernel not
#      planned (--reverse-twin --dg-twin), and the recompute's sweep beside the reverse sweep on a
#      side stream (--corun 1.0: B1's 80 programs; 3.0: B4's 320 too; plan.gla.GLA_BACKWARD_CORUN,
#      built offline; its GPU test of the same bits is in tests/gpu/test_gla_gpu.py), mamba_ssm and
#      fla in the same process;
#   1. the whole GPU suite (157 passed at c5fc8a6).
set -u
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 150 python -m pytest -m gpu tests/gpu/test_gluon_gla_dg_gpu.py tests/gpu/test_gla_gpu.py -k "dg or beside" \
    -p no:cacheprovider -q --tb=short 2>&1 | tail -15
timeout 300 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-twin --dg-twin --dg-sums-together --corun 1.0 --corun 3.0 --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
