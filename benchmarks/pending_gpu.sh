#!/bin/bash
# What waits for the H200, in one call (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh`,
# from the repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl). Each step has its
# own time limit so that one hang cannot take the others' results; $OUT receives the files. Pass
# the commit explicitly: the device's copy of the tree may report an older HEAD.
#
#   1. issue 22's replay row with SSD and GLA writing their packed result in place (6ccba28; the
#      Mamba2 rows were 1.2x eager's while they copied);
#   2. chunk_gla against fla in one process (863b5e5's run lost its JSON and fla's row to a time
#      limit), with GPU time by kernel, fla's kernels too;
#   3. the whole GPU suite (the GLA and SSD gradients now also with the recompute on the sweep).
set -u
C=${RECURSCAN_COMMIT:-unknown}
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
timeout 150 env PYTHONPATH=$PWD python benchmarks/gpu_traced_replay.py --out "$OUT/gpu_traced_replay_$C.json" 2>&1 \
    | grep -v Warning | tail -5
timeout 120 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_gla.py --only-per-key --profile --forward-only \
    --out "$OUT/gpu_gla_per_key_$C.json" 2>&1 | grep -v Warning | grep -v "^ " | tail -5
timeout 200 python -m pytest -m gpu -n 4 tests/gpu -p no:cacheprovider -o faulthandler_timeout=180 -q \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12
