#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. SSD's cold first forward + backward at B1 with the forward sweep's Gluon twin planned
#      (not measured at 00ab222: the session's device time ran out; 6.7-8.1 s before the twin);
#      the twin on the group prep's scores (GATE_SCORES, built without a GPU run; its row
#      plan.gla.GLUON_GLA_GROUP_SWEEP is off): its GPU tests, then SSD B4 as the variants
#      64:4:2:tma:grp:gluon and 64:4:3:tma:grp:gluon beside the planned group prep (0.592 ms);
#   1. the GLA / SSD forward and training rows as planned, with the forward sweep's calm gates
#      beside (their loads left synchronous by Triton 3.6's pipeliner: docs/kernels-gla-plan.md,
#      "The next GPU session"), mamba_ssm and fla in the same process, GPU time by kernel (the
#      next kernel change's before-and-after; 00ab222's rows: results/gpu_gla_sweep_00ab222.json);
#   2. the whole GPU suite (139 passed at 00ab222).
set -u
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
timeout 100 env PYTHONPATH=$PWD python benchmarks/gpu_gla_cold_ab.py 2>&1 | tail -8
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
timeout 240 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --sweep 64:4:2:calm --sweep 64:4:2:tma:grp:gluon --sweep 64:4:3:tma:grp:gluon --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | tail -16
timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
