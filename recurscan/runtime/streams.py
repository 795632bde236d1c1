"""The side stream a backward runs its recompute on beside its reverse sweep (the delta rule's and
GLA's corun): one a device, made to wait for the work queued so far on the current stream."""
from __future__ import annotations

import os

import torch

#: Device -> its side stream.
SIDE_STREAMS: dict = {}


def fork_side_stream(device: torch.device):
    """The side stream of ``device``, made to wait for the work queued so far on the current
    stream; None on the CPU and under the interpreter (one stream: the caller runs the side's
    launches in order on the current one)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return None
    side = SIDE_STREAMS.get(device)
    if side is None:
        side = SIDE_STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side
