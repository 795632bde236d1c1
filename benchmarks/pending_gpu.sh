#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The planned warp-specialised forward sweep (two outputs warpgroups, three stages: planned at
#      63bef49, a chunk 1.32 us a program at SSD B1, its outputs alone 1.13, the chain with the
#      loads ~1.0): its cold first forward + backward in a fresh process (the 10 s target; one more
#      Gluon kernel compiles on the first call), its timing probes 2 and 3 at three stages, and
#      Nsight Compute's stall reasons on it (what an instruction cut should go after: the outputs'
#      coefficient loads, the chain's state scaling; docs/kernels-gla-plan.md, "The next GPU
#      session", item 0);
#   1. the check of record: the forward and training rows beside mamba_ssm and fla in the same
#      process, SSD's also with the reverse sweep and the dg launch each on the kernel not planned,
#      and with the recompute on one stream (--corun 0.1: B1's training wall time moved 2.630 ->
#      2.724 ms across the group prep's split, so the corun's gain is checked again); the SSD
#      forward without the final states' store and transposed copy (1ecdcd4: 17.5 us at B4);
#   2. the whole GPU suite (162 passed and 2 failed at 63bef49, those two fixed at f59ee2b; it checks
#      c4d4b9f's unmasked coefficient loads bit for bit against the Triton sweep: run it first);
#   3. what bounds SSD training's reverse sweep: its timing probes (benchmarks/gpu_gla_reverse_probe.py:
#      the chain alone, the outputs alone), which decide docs/kernels-gla-plan.md's item 2c.
# Arguments: the steps to run (default: all four); `2`, `0` and `1 3` each fit a 600 s call.
set -u
STEPS=${*:-0 1 2 3}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
if step 0; then
timeout 200 env PYTHONPATH=$PWD python benchmarks/gpu_gla_cold_ab.py --forms planned --times 2 2>&1 | tail -4
timeout 120 env PYTHONPATH=$PWD python benchmarks/gpu_ssd_sweep_scaling.py --ws-only --probe 2 --probe 3 \
    --form 64:4:3:tma:grp:gluon:ws --heads 80 132 --out "$OUT/gpu_ssd_sweep_scaling_$C.json" 2>&1 | grep -E " H |rror"
form=64:4:3:tma:grp:gluon:ws
timeout 120 ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed --import-source yes \
    -k regex:sweep -o /tmp/prof_ws python -m benchmarks.ncu_ssd_sweep 1 16384 $form > /dev/null 2>&1
ncu -i /tmp/prof_ws.ncu-rep --page source --csv --print-source sass > /tmp/sass.csv 2>/dev/null && \
    python -m benchmarks.ncu_stalls /tmp/sass.csv 25 > "$OUT/ncu_ssd_sweep_ws3_$C.txt" 2>&1
head -40 "$OUT/ncu_ssd_sweep_ws3_$C.txt"
fi
step 1 && timeout 300 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-twin --dg-twin --corun 0.1 --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
step 2 && { timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12; }
step 3 && timeout 240 env PYTHONPATH=$PWD python benchmarks/gpu_gla_reverse_probe.py \
    --out "$OUT/gpu_gla_reverse_probe_$C.json" 2>&1 | grep -E "probe|rror"
