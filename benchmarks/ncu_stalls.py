"""Summarise Nsight Compute's per-instruction source page: stall reasons, instructions by opcode,
and the instructions with the most stall samples.

    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python -m benchmarks.ncu_stalls sass.csv [top]
"""
from __future__ import annotations

import collections
import csv
import sys


def sections(path: str):
    """(kernel name, header, rows) for each launch in the report: each starts with a "Kernel Name"
    row and its own header (launches of different kernels have different columns)."""
    name, hdr, data = None, None, []
    for r in csv.reader(open(path)):
        if r and r[0] == "Kernel Name":
            if hdr is not None:
                yield name, hdr, data
            name, hdr, data = r[1], None, []
        elif hdr is None:
            hdr = r
        elif len(r) >= len(hdr):
            data.append(r)
    if hdr is not None:
        yield name, hdr, data


def summarise_section(name, hdr, data, top: int = 20) -> str:
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    samples = lambda r: int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)  # noqa: E731
    opcode = lambda r: (r[ix["Source"]].split() or ["?"])[1 if r[ix["Source"]].strip().startswith("@") else 0].split(".")[0]  # noqa: E731
    total = sum(samples(r) for r in data) or 1
    by_reason = collections.Counter({c: sum(int(r[ix[c]] or 0) for r in data) for c in stall_cols})
    executed, op_samples = collections.Counter(), collections.Counter()
    for r in data:
        executed[opcode(r)] += int(r[ix["Instructions Executed"]] or 0)
        op_samples[opcode(r)] += samples(r)
    n_exec = sum(executed.values()) or 1
    out = [f"{name}: stall samples {total}"]
    out += [f"  {c:26s} {v:8d} {100 * v / total:5.1f}%" for c, v in by_reason.most_common(8)]
    out.append(f"warp instructions executed {n_exec}, by opcode (share of instructions, of stall samples)")
    out += [f"  {o:12s} {v:11d} {100 * v / n_exec:5.1f}%  {100 * op_samples[o] / total:5.1f}%"
            for o, v in executed.most_common(15)]
    out.append("instructions with the most stall samples")
    for r in sorted(data, key=samples, reverse=True)[:top]:
        reason = max(stall_cols, key=lambda c: int(r[ix[c]] or 0))
        out.append(f"  {r[ix['Address']][-5:]} {100 * samples(r) / total:5.2f}% {reason:16s} {r[ix['Source']].strip()[:70]}")
    return "\n".join(out)


def summarise(path: str, top: int = 20) -> str:
    """The launches with stall samples, each summarised (a launch that returned at once has none)."""
    parts = [summarise_section(name, hdr, data, top) for name, hdr, data in sections(path)
             if any(r[hdr.index("Warp Stall Sampling (All Samples)")] not in ("", "0") for r in data)]
    return "\n\n".join(parts)


if __name__ == "__main__":
    print(summarise(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20))
