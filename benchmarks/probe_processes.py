"""The timing probes' process loop, shared by the probe benchmarks (gpu_gla_reverse_probe.py,
gpu_delta_reverse_probe.py): a kernel module reads its probe variable once, when it is imported,
so each probe runs in a process of its own, the script again with ``--child FILE``, writing its
rows there as JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def rows_by_probe(script: str, variable: str, probes, child_args=()) -> list:
    """The rows of ``script --child FILE *child_args`` run once per probe with ``variable`` set to
    it in the environment, in the order of ``probes``."""
    rows = []
    for probe in probes:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            env = dict(os.environ, **{variable: probe})
            subprocess.run([sys.executable, script, "--child", f.name, *child_args], env=env, check=True)
            rows += json.load(open(f.name))
    return rows


def save(path: str, rows: list) -> None:
    """``rows`` as JSON at ``path``, with the torch version, the GPU's name and RECURSCAN_COMMIT."""
    import torch
    json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(),
                   commit=os.environ.get("RECURSCAN_COMMIT", "unknown"), rows=rows), open(path, "w"), indent=1)
