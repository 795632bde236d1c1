#!/bin/bash
# What waits for the H200 (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh STEPS`, from the
# repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm sdist). Each
# step has its own time limit so that one hang cannot take the others' results; $OUT receives the
# files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The whole GPU suite, the new tests first under a short limit (a hang must not take the
#      suite's call). New since 2c61664 (170 + 7 passed there, gpu_tests_2c61664.log): the warp-
#      specialised forward sweep in phases (PASS 3, 0e26f72: test_gluon_gla_sweep_gpu.py's
#      "in_phases"), and simple GLA's group prep without its key read (5c1d70c: the sweep keeps a
#      bad key's score past a reset; the "forming_its_scores" tests, the NaN key's among them,
#      which now also pins the final state's NaN row to the key's), and the dg twin warp-specialised
#      (test_gluon_gla_dg_gpu.py's "warp-specialised" cases: the Triton kernel's dg to float32
#      rounding, SSD training's gradients); the warp-specialised sweep keeping the chunk states for the
#      backward (its chain's hand-over buffer held as S and stored by one bulk copy a chunk: the Triton
#      sweep's bf16 chunk states bit for bit, "kept" / "keeps" tests), and training from them against
#      the recompute (plan.gla.GLA_FORWARD_STATES); SSD's x and dt gradients formed in the warp-specialised
#      reverse sweep (SSD_GRADS, plan.gla.GLA_REVERSE_SSD_GRADS: "x_and_dt"). Cold compiles: 6 workers.
#   1. The forward rows of record, medians: simple GLA B4 / B8 (the prep without its key read: 21
#      us of B4's 118 at 2c61664; 2x fla's GPU time needs ~103 in all), SSD B1 / B4 with the warp-
#      specialised sweep in phases beside the planned one pass (B1: 80 sweep programs leave 52 SMs
#      to the next phases' group preps, whose 29 us now precede the sweep; 2x mamba_ssm's GPU time
#      needs ~347 us, 357 at 2c61664; plan the best phased form on a row of its own if it wins).
#   2. Training, medians (the warp-specialised reverse sweep planned since 36a52e9), each beside the
#      planned form: --dg-specialized, the dg twin warp-specialised (the twin takes 659 us of B1's
#      2680 us of GPU time; plan GLUON_GLA_DG_SPECIALIZED if it wins); --forward-states, the forward
#      keeping its chunk states so that the backward skips the recompute's sweep (406 us of B1's GPU
#      time beside the reverse sweep; simple GLA's whole recompute, 144 us at B4; plan
#      GLA_FORWARD_STATES if it wins, and say what it costs: 335 MB at SSD B1 T16384); --ssd-grads,
#      x's and dt's gradients in the reverse sweep (step_backward's 237 us of B1 go, the sweep's
#      outputs loop takes 1044 instructions a chunk against 689 offline), alone and with the kept
#      states ("both": then v = dt x is formed nowhere, the parallel stage's V_FROM_X, 95 us of B1),
#      and "all three" with the dg twin warp-specialised: plan GLA_REVERSE_SSD_GRADS if it wins.
# Arguments: the steps to run (default: all three); each fits a 600 s call alone.
set -u
STEPS=${*:-0 1 2}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
# The new tests first, alone under a short limit; then the suite without them.
NEW="in_phases or forming_its_scores or warp-specialised or keeps_the or kept_chunk or x_and_dt"
step 0 && { timeout 200 python -m pytest -m gpu -n 4 tests/gpu/test_gluon_gla_sweep_gpu.py tests/gpu/test_gluon_gla_dg_gpu.py \
    -k "$NEW" -p no:cacheprovider -o faulthandler_timeout=190 -q > "$OUT/gpu_tests_new_$C.log" 2>&1; \
    echo "new tests rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_new_$C.log" | tail -8; \
    timeout 380 python -m pytest -m gpu -n 6 tests/gpu -k "not ($NEW)" -p no:cacheprovider -o faulthandler_timeout=370 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12; }
W=tma:grp:gluon:ws
RUN="env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile"
step 1 && timeout 450 $RUN \
    --gla 8:4096:16 --sweep 64:4:3:$W --sweep 64:4:3:ph2:pr4:$W --sweep 64:4:3:ph3:pr3:$W --sweep 64:4:3:ph4:pr2:$W \
    --sweep 64:4:3:ph6:pr1.5:$W --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -60
step 2 && timeout 500 $RUN --train --train-only --dg-specialized --forward-states --ssd-grads \
    --out "$OUT/gpu_gla_train_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -60
