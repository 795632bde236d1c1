import json, sys, torch
from benchmarks import gpu_decode as G, registry
from recurscan.kernels import recurrent as R
rows = []
for name, n in (("gdn_decode_256", 256),):
    w = registry.Workload(name, "gdn_decode", (1,) * n, heads=16, value_heads=32)
    x = w.make_inputs("cuda")
    start, ref = x["state"].clone(), None
    for BV, nw in [(32, 1), (32, 2), (64, 2), (64, 4), (128, 4), (32, 1)]:
        row, got = G._gdn_decode_config(w, x, R.StreamConfig(128, BV, nw, 1, "sweep"), start, ref)
        ref = ref or got
        rows.append(row)
json.dump({"command": "python /tmp/kvcfg.py (benchmarks.gpu_decode._gdn_decode_config, [K, V] shapes at T = 1)",
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
