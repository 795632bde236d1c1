"""Launch shapes of the GLA engine (kernels/gla/; chunked SSD runs on it too): one row for now, not
yet measured on a GPU (docs/kernels-gla-plan.md); the rules in plan/__init__.py run it only where
asked for."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlaShape:
    block_v: int  # value columns a program carries
    num_warps: int
    reason: str
    # A scalar decay (and SSD) through the prep and the sweep with PER_KEY, as a decay per key
    # runs (kernels/gla/prep.py): the chunk's A and gates parallel over chunks, the sweep's loop
    # the state's chain alone; False: one fused kernel. Not timed on a GPU yet (an A/B flag).
    split: bool = False


GLA_LAUNCH = GlaShape(64, 8, "64 value columns on 8 warps: offline for sm_90 the chunk loop spills 40 local "
                              "loads and stores against 193 on 4 warps; not timed on a GPU yet")


def gla_shape(problem, device) -> GlaShape:
    """The GLA kernels' launch shape for ``problem`` (a GlaProblem or SsdProblem) on ``device``."""
    return GLA_LAUNCH


def triton_gla_unsupported(problem) -> str | None:
    """Why the GLA Triton kernel cannot take this problem, or None if it can."""
    import torch
    if problem.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"inputs in {problem.dtype}: the kernel takes float16, bfloat16 or float32"
    if problem.key_dim > 256:
        return f"K = {problem.key_dim} > 256: a program holds a [BV, K] state tile on chip"
    return None


def triton_ssd_unsupported(problem) -> str | None:
    """Why the chunked SSD cannot run on the GLA kernel (q = C, k = B, v = dt x), or None."""
    import torch
    if problem.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"inputs in {problem.dtype}: the kernel takes float16, bfloat16 or float32"
    if problem.state_dim > 256:
        return f"dstate = {problem.state_dim} > 256: a program holds a [BV, dstate] state tile on chip"
    return None
