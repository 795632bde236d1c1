"""Launch shapes of the GLA engine (kernels/gla/; chunked SSD runs on it too): one row for now
(docs/kernels-gla-plan.md; the H200 figures in docs/perf-history.md)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlaShape:
    block_v: int  # value columns a program carries
    num_warps: int
    reason: str
    # A scalar decay (and SSD) through the prep and the sweep with PER_KEY, as a decay per key
    # runs (kernels/gla/prep.py): the chunk's A and gates parallel over chunks, the sweep's loop
    # the state's chain alone; False: one fused kernel. Slower on the H200 (chunk_simple_gla B4
    # T4096 forward 1.87 against 0.50 ms, SSD B1 T16384 9.05 against 1.96:
    # gpu_gla_split_shapes_357d748.json), as the per-key path itself is (chunk_gla 2.49 ms, fla
    # 0.72); kept to run a scalar decay through that path in its tests.
    split: bool = False


GLA_LAUNCH = GlaShape(64, 8, "64 value columns on 8 warps: offline for sm_90 the chunk loop spills 40 local "
                              "loads and stores against 193 on 4 warps; on the H200 chunk_simple_gla B4 T4096 "
                              "0.49 ms forward (fla 0.24), SSD B1 T16384 2.1 (mamba_ssm 0.70; "
                              "gpu_gla_cold_357d748.json)")


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
