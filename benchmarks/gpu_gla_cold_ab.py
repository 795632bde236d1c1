"""SSD's cold first forward + backward (B1 T16384, 80 heads x 64, dstate 128; benchmarks/gpu_gla.py's
``--cold`` call), each in a fresh process with an empty Triton cache, alternating three times: as
planned (the forward's sweep, the recompute and the reverse sweep on their Gluon twins), with no
Gluon twin (``plan.gla.gluon_usable`` False: the Triton sweep, the delta prep in phases) and with
the reverse sweep on the Triton kernel (plan.gla.GLUON_GLA_REVERSE_SWEEP off), and as planned with
torch's own import on its first ``autograd.grad`` given grad_outputs done before the clock (about 2 s
of the first call otherwise: benchmarks/gpu_delta_train.py's ``cold``). Writes
``$OUT/gpu_gla_cold_ab_<commit>.json`` where ``OUT`` is set, else prints only.

    PYTHONPATH=$PWD python benchmarks/gpu_gla_cold_ab.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from benchmarks.gpu_gla import COLD

PATCH = {"planned": "", "no Gluon twin": "import recurscan.plan.gla as _plan\n"
                                         "_plan.gluon_usable = lambda device: False\n",
         "the reverse sweep on the Triton kernel": "import dataclasses, recurscan.plan.gla as _plan\n"
                                                   "_plan.GLUON_GLA_REVERSE_SWEEP = dataclasses.replace("
                                                   "_plan.GLUON_GLA_REVERSE_SWEEP, on=False)\n",
         # torch's own import on a first autograd.grad given grad_outputs (sympy, 2.0-2.5 s on an H100
         # machine lent: results/cold_sympy_ab_h100_94411ab.txt) done before the clock starts
         "planned with torch's import first": "import torch.fx.experimental.symbolic_shapes\n"}


def main() -> None:
    """``--forms planned`` (comma-separated names of :data:`PATCH`) and ``--times N`` (3) narrow the runs."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--forms", default=",".join(PATCH))
    ap.add_argument("--times", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for form in args.forms.split(",") * args.times:
        code = COLD.replace("import recurscan\n", "import recurscan\n" + PATCH[form], 1)
        with tempfile.TemporaryDirectory() as cache:
            out = subprocess.run([sys.executable, "-c", code, "1", "16384"], capture_output=True, text=True,
                                 env=dict(os.environ, TRITON_CACHE_DIR=cache), check=True)
        setup, first = map(float, out.stdout.split()[-2:])
        print(f"{form}: import and inputs {setup:.1f} s, first forward + backward {first:.1f} s", flush=True)
        rows.append(dict(form=form, cold_import_s=setup, cold_first_call_s=first))
    if os.environ.get("OUT"):
        commit = os.environ.get("RECURSCAN_COMMIT") or subprocess.run(  # the device's copy may report an older HEAD
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(os.path.join(os.environ["OUT"], f"gpu_gla_cold_ab_{commit or 'unknown'}.json"), "w") as f:
            json.dump(dict(rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
