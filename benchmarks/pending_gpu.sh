#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl). Each step has its
# own time limit so that one hang cannot take the others' results; $OUT receives the files.
#
#   1. issue 22's replay row: compiled graph replay against eager graph replay (GDN, Mamba2), the
#      GDN scan now writing its packed 16-bit result in place;
#   2. chunk_gla's forward with the prep's block totals as before 7886a4e and A's diagonal blocks
#      apart;
#   3. the whole GPU suite.
set -u
C=${RECURSCAN_COMMIT:-unknown}
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
timeout 100 env PYTHONPATH=$PWD python benchmarks/gpu_traced_replay.py --out "$OUT/gpu_traced_replay_$C.json" 2>&1 \
    | grep -v Warning | tail -5
timeout 45 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_gla.py --only-per-key --profile --forward-only \
    --out "$OUT/gpu_gla_per_key_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -5
timeout 130 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=120 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
