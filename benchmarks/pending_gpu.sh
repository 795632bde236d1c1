#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm
# sdist). Each step has its own time limit so that one hang cannot take the others' results;
# $OUT receives the files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. What a forward sweep program's chunk waits on (issue 20's SSD forward rows): a chunk takes
#      ~1.5 us a program whatever the form (the Gluon twin, or warp-specialised with the chain's
#      step one product: DeltaShape.specialized, built and measured at ee12775..d3dfd70, off) and
#      however many programs run (20 to 132: benchmarks/gpu_ssd_sweep_scaling.py), so neither the
#      L2 nor the chain's products bound it. Nsight Compute on both forms at SSD B1 T16384, stall
#      reasons per instruction (a Gluon kernel under ncu once crashed the profiled process: the dq/dk
#      twin, 2026-12-03); and the warp-specialised form's timing probes (the ring of loads alone,
#      with the chain, with the outputs: kernels/gluon/gla_sweep_specialized.py's PROBE, built
#      offline at the end of session 24), which split a chunk's 1.5 us between them without ncu,
#      and that form with a third ring stage (216 KB);
#   1. the check of record: the forward and training rows beside mamba_ssm and fla in the same
#      process, SSD's also with the reverse sweep and the dg launch each on the kernel not planned;
#   2. the whole GPU suite (159 passed at aeb0590).
# Arguments: the steps to run (default: all three; `0` alone, then `1 2`, fit two 600 s calls).
set -u
STEPS=${*:-0 1 2}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
if step 0; then
timeout 150 env PYTHONPATH=$PWD python benchmarks/gpu_ssd_sweep_scaling.py --ws --probe 1 --probe 2 --probe 3 \
    --form 64:4:3:tma:grp:gluon:ws --heads 80 132 --out "$OUT/gpu_ssd_sweep_scaling_$C.json" 2>&1 | grep -E " H |rror"
for form in 64:4:2:tma:grp:gluon 64:4:2:tma:grp:gluon:ws; do
    timeout 120 ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed --import-source yes \
        -k regex:sweep -o /tmp/prof_${form//:/_} python -m benchmarks.ncu_ssd_sweep 1 16384 $form > /dev/null 2>&1
    ncu -i /tmp/prof_${form//:/_}.ncu-rep --page source --csv --print-source sass > /tmp/sass.csv 2>/dev/null && \
        python -m benchmarks.ncu_stalls /tmp/sass.csv 15 > "$OUT/ncu_ssd_sweep_${form//:/_}_$C.txt" 2>&1
    head -30 "$OUT/ncu_ssd_sweep_${form//:/_}_$C.txt"
done
fi
step 1 && timeout 300 env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile --train \
    --reverse-twin --dg-twin --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -40
step 2 && { timeout 290 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=280 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12; }
