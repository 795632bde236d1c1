"""The chunked engine of the diagonal-decay families (docs/kernels-gla-plan.md): gated linear
attention with a scalar decay per head (simple GLA, RetNet, linear attention; Mamba2 SSD to come).
Device code only; launch/gla.py builds the launches, plan/ decides."""
