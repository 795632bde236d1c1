#!/bin/bash
# What waits for the H200 (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh STEPS`, from the
# repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm sdist). Each
# step has its own time limit so that one hang cannot take the others' results; $OUT receives the
# files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The whole GPU suite, the new tests first under a short limit (a hang must not take the
#      suite's call). New since 7a865ad (its suite: 171 + 23 passed, gpu_tests_*_7a865ad.log): the
#      planner's SSD / simple GLA training with the chunk states kept, x's and dt's gradients in the
#      reverse sweep and the dg twin warp-specialised (every training test now runs them), and the
#      parallel stage forming v = dt x as a form of its own (plan.gla.GLA_PARALLEL_V_FROM_X, off:
#      "v formed nowhere").
#   1. The forward rows of record, medians: simple GLA B4 (105 us of GPU time at 7a865ad; 2x fla's
#      needs ~103), SSD B1 / B4 with the warp-specialised sweep in two or three phases (ph4:pr2 and
#      ph6:pr1.5 lost at 7a865ad: 0.386 and 0.406 ms at B1 against 0.361).
#   2. Training, medians, the planned form beside each planner flag flipped alone (--forward-states,
#      --ssd-grads, --v-from-x, --dg-specialized): "all three" offline builds with v formed nowhere
#      took 1998 us of GPU time at B1 (mamba_ssm 2954), and v formed nowhere cost ~150 us of it.
# Arguments: the steps to run (default: all three); the three fit one 600 s call.
set -u
STEPS=${*:-0 1 2}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
# The new tests first, alone under a short limit; then the suite without them.
NEW="kept_chunk or x_and_dt or keeps_the"
step 0 && { timeout 100 python -m pytest -m gpu -n 4 tests/gpu/test_gluon_gla_sweep_gpu.py tests/gpu/test_gluon_gla_dg_gpu.py \
    -k "$NEW" -p no:cacheprovider -o faulthandler_timeout=95 -q > "$OUT/gpu_tests_new_$C.log" 2>&1; \
    echo "new tests rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_new_$C.log" | tail -8; \
    timeout 270 python -m pytest -m gpu -n 6 tests/gpu -k "not ($NEW)" -p no:cacheprovider -o faulthandler_timeout=260 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12; }
W=tma:grp:gluon:ws
RUN="env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile"
step 1 && timeout 150 $RUN \
    --sweep 64:4:3:ph2:pr1:$W --sweep 64:4:3:ph2:pr2:$W --sweep 64:4:3:ph3:pr2:$W --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -60
step 2 && timeout 200 $RUN --train --train-only --dg-specialized --forward-states --ssd-grads --v-from-x \
    --out "$OUT/gpu_gla_train_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -60
