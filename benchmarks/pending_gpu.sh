#!/bin/bash
# What waits for the H200 (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh STEPS`, from the
# repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm sdist). Each
# step has its own time limit so that one hang cannot take the others' results; $OUT receives the
# files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The GPU tests changed or new since 20319ea's suite (178 passed, 6 failed there: tests whose
#      plan changed under them, now pinned to the plan they test), and the group prep without
#      SCORES in blocks across query/key heads (0cfba81: the "forming_its_scores" tests).
#   1. The forward rows of record, medians: simple GLA B4 / B8 (105 us of GPU time at 7a865ad, the
#      group prep 7 of it in 4096 programs; 256 programs since 0cfba81; 2x fla's needs ~102.5), and
#      the group prep's warps and register cap at SSD B1 / B4 (its 29 us precede the sweep; the
#      sweep's 80 programs at B1 leave 52 SMs idle; 2x mamba_ssm's GPU time needs ~348 us, 357 now).
#   2. transformers' Mamba2 mixer trained for 50 steps with the backward as planned since 20319ea
#      (the chunk states kept, x's and dt's gradients in the reverse sweep, the dg twin warp-
#      specialised) against its torch path (benchmarks/results/train_mamba2_mixer.{json,png}).
#   3. SSD's cold first forward + backward in a fresh process (target 10 s; 7.7 s at aa74b18), now
#      with the warp-specialised dg and the reverse sweep's SSD_GRADS among its kernels.
# Arguments: the steps to run (default: all four); together they fit one 600 s call.
set -u
STEPS=${*:-0 1 2 3}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
NEW="recompute_beside or reverse_sweep_twin_gives or warp_specialised_reverse_sweep_gives or forming_its_scores"
step 0 && { timeout 150 python -m pytest -m gpu -n 4 tests/gpu/test_gla_gpu.py tests/gpu/test_gluon_gla_sweep_gpu.py \
    -k "$NEW" -p no:cacheprovider -o faulthandler_timeout=140 -q > "$OUT/gpu_tests_new_$C.log" 2>&1; \
    echo "new tests rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_new_$C.log" | tail -8; }
W=tma:grp:gluon:ws
Q=tma:qk:gluon:ws
RUN="env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile"
step 1 && timeout 150 $RUN --gla 8:4096:16 \
    --sweep 64:4:3:$Q:pw2 --sweep 64:4:3:$Q:pw8 --sweep 64:4:3:$W:pw8 --sweep 64:4:3:$W:reg128 \
    --sweep 64:4:3:$W:pw8:reg0 --sweep 64:4:3:$W:pw2:reg0 --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -60
step 2 && timeout 100 env PYTHONPATH=$PWD python benchmarks/train_mamba2_mixer.py --out "$OUT/train_mamba2_mixer" 2>&1 | tail -4
step 3 && timeout 80 env PYTHONPATH=$PWD python benchmarks/gpu_gla_cold_ab.py --forms planned --times 2
