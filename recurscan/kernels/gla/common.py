"""Pieces the GLA kernels share (kernels/gla/forward.py, kernels/gla/prep.py)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _ssd_steps(dt, dt_bias, rows, m_r, i_hv, HV: tl.constexpr, dt_min, dt_max, HAS_DT_BIAS: tl.constexpr,
               DT_SOFTPLUS: tl.constexpr, DT_LIMIT: tl.constexpr):
    """Mamba2's step sizes of ``rows`` (value head i_hv): clamp(softplus?(dt + dt_bias),
    [dt_min, dt_max]), each part where its flag is set; float32, [len(rows)]."""
    b_dt = tl.load(dt + rows * HV + i_hv, mask=m_r, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(dt_bias + i_hv).to(tl.float32)
    if DT_SOFTPLUS:  # torch's softplus: linear above 20
        b_dt = tl.where(b_dt > 20.0, b_dt, tl.log(1.0 + tl.exp(tl.minimum(b_dt, 20.0))))
    if DT_LIMIT:
        b_dt = tl.minimum(tl.maximum(b_dt, dt_min), dt_max)
    return b_dt
