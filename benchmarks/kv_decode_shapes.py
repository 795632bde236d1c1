"""[K, V]-state GDN decode (one token per request) at several launch shapes, each run from the same
state and compared with the first; bandwidth under do_bench (L2 flushed).

    python benchmarks/kv_decode_shapes.py benchmarks/results/kv_decode_shapes.json
"""
import json, sys
from benchmarks import gpu_decode as G, registry
from recurscan.plan import StreamShape
rows = []
for name, n, sd in (("gdn_decode_256", 256, "float32"), ("gdn_decode_1024", 1024, "float32"),
                    ("gdn_decode_256_bf16", 256, "bfloat16")):
    w = registry.Workload(name, "gdn_decode", (1,) * n, heads=16, value_heads=32, state_dtype=sd)
    x = w.make_inputs("cuda")
    start, ref = x["state"].clone(), None
    for BV, nw in [(32, 1), (64, 4), (64, 8), (128, 4), (128, 8), (32, 2)]:
        row, got = G._gdn_decode_config(w, x, StreamShape(128, BV, nw, 1, "sweep"), start, ref)
        ref = ref or got
        rows.append(row)
json.dump({"command": "python /tmp/kvcfg.py (benchmarks.gpu_decode._gdn_decode_config, [K, V] shapes at T = 1)",
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
