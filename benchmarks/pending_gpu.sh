#!/bin/bash
# What waits for the H200 (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh STEPS`, from the
# repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm sdist). Each
# step has its own time limit so that one hang cannot take the others' results; $OUT receives the
# files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The whole GPU suite. At 48b720c (simple GLA's scores formed in the warp-specialised sweep,
#      planned) 168 tests passed and none failed before its 230 s limit cut the cold run short
#      (~30 not reached); the GLA files alone passed (63, gpu_tests_gla_qk2.log) one commit
#      earlier. Cold compiles take most of it: 6 workers, 450 s.
#      The suite also runs the warp-specialised reverse sweep's new tests (built offline, never run:
#      tests/gpu/test_gluon_gla_reverse_sweep_gpu.py's "specialized" cases, the Triton kernel's bits;
#      test_gluon_gla_sweep_gpu.py's SSD training gradients against the twin's).
#   1. The check of record with the median of the repeats (d354f57; until then do_bench's mean,
#      which host stalls moved: fla's simple GLA row read 0.31-0.66 ms for 0.204 of GPU time): the
#      forward and training rows beside mamba_ssm and fla, simple GLA also at B8 and on the group
#      prep's scores (the form before 48b720c's row); the group prep on 8 warps (pw8: 63 registers,
#      4 programs an SM by registers, against 155 and 3 on 4 warps, offline; SSD B1 needs ~11 us of
#      its 360 for 2x mamba_ssm's GPU time, and the prep takes 30 for ~50 MB); SSD training with the
#      reverse sweep warp-specialised (--reverse-specialized; plan it if it wins: the twin takes
#      646 us of B1's training, its outputs 2.34 of its 2.55 us a chunk).
# Arguments: the steps to run (default: both); each fits a 600 s call alone.
set -u
STEPS=${*:-0 1}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
# The never-run warp-specialised reverse sweep first, alone under a short limit: a kernel that hangs
# (an mbarrier phase wrong) must not take the whole suite's call; then the suite without it.
NEW="specialized or warp_specialised_reverse"
step 0 && { timeout 150 python -m pytest -m gpu tests/gpu/test_gluon_gla_reverse_sweep_gpu.py tests/gpu/test_gluon_gla_sweep_gpu.py \
    -k "$NEW" -p no:cacheprovider -o faulthandler_timeout=140 -q > "$OUT/gpu_tests_new_$C.log" 2>&1; \
    echo "new kernel's tests rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_new_$C.log" | tail -8; \
    timeout 400 python -m pytest -m gpu -n 6 tests/gpu -k "not ($NEW)" -p no:cacheprovider -o faulthandler_timeout=390 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12; }
# --reverse-specialized only once step 0 showed the new kernel's tests pass (drop it otherwise).
step 1 && timeout 420 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-specialized --gla 8:4096:16 --sweep 64:4:3:tma:grp:gluon:ws --sweep 64:4:3:tma:pw8:grp:gluon:ws \
    --sweep 64:4:3:tma:pw8:qk:gluon:ws --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
