#!/bin/bash
# What waits for the H200, in one call of under 10 minutes (`RECURSCAN_COMMIT=<hash> bash
# benchmarks/pending_gpu.sh`, from the repository root with .whl carried:
# fla_core-0.6.0-py3-none-any.whl). Each step has its own time limit so that one hang cannot take
# the others' results; $OUT receives the files.
#
#   1. chunk_gla (a decay per key): A's diagonal blocks by their own kernel (planned) against them
#      in the prep, the fused kernel and fla, with GPU time by kernel; its forward + backward;
#   2. issue 22's replay row: compiled graph replay against eager graph replay (GDN, Mamba2);
#   3. the whole GPU suite.
set -u
C=${RECURSCAN_COMMIT:-unknown}
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
timeout 120 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_gla.py --only-per-key --profile \
    --out "$OUT/gpu_gla_per_key_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -8
timeout 200 env PYTHONPATH=$PWD python benchmarks/gpu_traced_replay.py --out "$OUT/gpu_traced_replay_$C.json" 2>&1 \
    | grep -v Warning | tail -8
timeout 220 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=200 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -15
