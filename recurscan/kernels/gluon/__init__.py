"""Gluon twins of Triton stages (GPU only, sm_90): each computes what its Triton twin computes,
the twin being the readable reference and what the interpreter tests. The rules they live under
(a Triton twin, an sm_90 compile in CI, a GPU comparison with the twin, the planner's choice where
measured faster) are in docs/kernels-gluon.md; whether this process may launch them is
``plan.device.gluon_usable``. Nothing here is imported unless the planner chose a twin.

- :mod:`.delta_sweep`: the delta rule's forward sweep (twin: ``kernels/delta/sweep.py``'s
  ``chunk_delta_sweep_kernel``).
- :mod:`.delta_fused`: the delta rule's prefill with the prep beside the chain, warp-specialised
  (twin: the planned ``kernels/delta/prep.py`` and ``sweep.py``), on :mod:`.wy_inverse`'s inverse.
- :mod:`.delta_backward_sweep`: the delta rule's reverse sweep
  (twin: ``kernels/delta/backward.py``'s ``chunk_delta_bwd_sweep_kernel``).
- :mod:`.delta_backward_dqdk`: dq and dk of the delta rule's backward
  (twin: ``kernels/delta/backward.py``'s ``chunk_delta_bwd_dqdk_kernel``).
- :mod:`.delta_backward_scores_specialized`: the delta rule's backward scores kernel,
  warp-specialised (twin: ``kernels/delta/backward.py``'s ``chunk_delta_bwd_scores_kernel``).
- :mod:`.gla_backward_sweep`: the GLA backward's reverse sweep on the group prep's scores
  (twin: ``kernels/gla/backward.py``'s ``chunk_simple_gla_bwd_sweep_kernel`` with GATE_SCORES).
- :mod:`.gla_backward_dg`: the GLA backward's dg launch of a group of value heads
  (twin: ``kernels/gla/backward.py``'s ``chunk_simple_gla_bwd_grads_kernel`` with PART 2).
"""
