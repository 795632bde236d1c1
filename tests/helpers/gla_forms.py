"""The launch forms of the scalar-decay GLA and SSD forward that the interpreter tests run through
the public ops: the planner's (the delta rule's prep and sweep with the WY step off), the same in
segments or phases, the fused GLA kernel, and the split one (the per-key prep, then the GLA sweep
with PER_KEY); and those of a decay per key (:func:`use_per_key_form`)."""
from dataclasses import replace

from recurscan.plan import gla as plan_gla
from recurscan.plan.delta import DeltaShape

SWEEP_VARIANTS = {
    "sweep segments": DeltaShape(32, 4, 2, 4, "tests: the sweep in 3 segments", segments=3, v_product=False),
    "sweep phases": DeltaShape(16, 4, 2, 4, "tests: the sweep in 3 phases", phases=3, v_product=False),
    "sweep, 4 heads a prep program": DeltaShape(32, 4, 2, 4, "tests: 4 value heads a prep program", v_product=False,
                                                 prep_heads=4),
    "sweep, 1 head a prep program": DeltaShape(32, 4, 2, 4, "tests: 1 value head a prep program", v_product=False),
    "sweep, group prep": DeltaShape(32, 4, 2, 4, "tests: the group prep", v_product=False, group_prep=True),
    "sweep, group prep, 4 heads a program": DeltaShape(32, 4, 2, 4, "tests: the group prep in blocks of 4 heads",
                                                       v_product=False, group_prep=True, group_prep_heads=4),
    "sweep, group prep, 32 heads a program": DeltaShape(32, 4, 2, 4, "tests: the group prep in blocks of 32 heads",
                                                        v_product=False, group_prep=True, group_prep_heads=32),
    "sweep segments, group prep": DeltaShape(32, 4, 2, 4, "tests: the group prep, 3 segments", segments=3,
                                             v_product=False, group_prep=True),
    "sweep phases, group prep": DeltaShape(16, 4, 2, 4, "tests: the group prep, 3 phases", phases=3,
                                           v_product=False, group_prep=True),
    "sweep, scores in the sweep": DeltaShape(32, 4, 2, 4, "tests: the group prep's coef alone, the sweep forming "
                                             "the scores", v_product=False, group_prep=True, sweep_scores=True),
    "sweep segments, scores in the sweep": DeltaShape(32, 4, 2, 4, "tests: the sweep forming the scores, 3 segments",
                                                      segments=3, v_product=False, group_prep=True,
                                                      sweep_scores=True),
    "sweep, calm gates": DeltaShape(32, 4, 2, 4, "tests: the group prep, calm gates", v_product=False,
                                    group_prep=True, calm_gates=True),
    "sweep segments, calm gates": DeltaShape(32, 4, 2, 4, "tests: the group prep, calm gates, 3 segments", segments=3,
                                             v_product=False, group_prep=True, calm_gates=True),
    "sweep phases, calm gates": DeltaShape(16, 4, 2, 4, "tests: the group prep, calm gates, 3 phases", phases=3,
                                           v_product=False, group_prep=True, calm_gates=True),
}


def use_form(form, monkeypatch):
    """Set the planner so that a scalar decay runs in ``form``: "sweep" (the planner's), a key of
    :data:`SWEEP_VARIANTS`, "fused" or "split"."""
    if form == "fused":
        monkeypatch.setattr(plan_gla, "SCALAR_ON_SWEEP", False)
    elif form == "split":
        monkeypatch.setattr(plan_gla, "GLA_LAUNCH", plan_gla.GlaShape(64, 8, "tests: the split launch", split=True))
    elif form in SWEEP_VARIANTS:
        monkeypatch.setattr(plan_gla, "gla_sweep_shape",
                            lambda problem, device, gluon=True: plan_gla.with_prep_heads(SWEEP_VARIANTS[form],
                                                                                           problem))
    else:
        assert form == "sweep", form


PER_KEY_FORMS = ("sweep", "fused", "sweep segments", "sweep, general steps", "sweep, general steps, key blocks of 16",
                 "sweep, calm pass of 16 keys")


def use_per_key_form(form, monkeypatch):
    """Set the planner so that a decay per key runs in ``form``: "sweep" (the planner's: the
    per-key prep, its calm pass then its general steps, and the delta sweep with KEY_DECAY),
    "sweep segments" (the general steps, and the sweep in 3 segments), "sweep, general steps"
    (no calm pass), "sweep, general steps, key blocks of 16" (their loop over keys 16 at a time),
    "sweep, calm pass of 16 keys" (the calm pass's loop over keys 16 at a time, on 4 warps) or
    "fused" (the per-key prep and the fused kernel with PER_KEY)."""
    if form == "fused":
        monkeypatch.setattr(plan_gla, "PER_KEY_ON_SWEEP", False)
    elif form == "sweep segments":
        shape = DeltaShape(32, 4, 2, 8, "tests: the per-key sweep in 3 segments", segments=3, v_product=False,
                           prep_maxnreg=None)
        monkeypatch.setattr(plan_gla, "per_key_sweep_shape", lambda problem, device: shape)
    elif form == "sweep, general steps":
        monkeypatch.setattr(plan_gla, "PER_KEY_CALM_PASS", None)
    elif form == "sweep, general steps, key blocks of 16":
        monkeypatch.setattr(plan_gla, "PER_KEY_CALM_PASS", None)
        planned = plan_gla.per_key_sweep_shape
        monkeypatch.setattr(plan_gla, "per_key_sweep_shape",
                            lambda problem, device: replace(planned(problem, device), prep_key_block=16))
    elif form == "sweep, calm pass of 16 keys":
        monkeypatch.setattr(plan_gla, "PER_KEY_CALM_PASS", (16, 4, None))
    else:
        assert form == "sweep", form


GRADS_FORMS = ("per head", "group", "group, dg with dq and dk", "group in shares", "group, dq and dk apart")


def use_grads_form(form, monkeypatch):
    """Set the planner so that the backward's parallel stage runs in ``form``: "per head" (one value
    head a program, the group's heads summed after), "group" (a query/key head's value heads summed
    in one program, dg in a launch of its own, 2 heads a program there), "group, dg with dq and dk"
    (dg in the same programs), "group in shares" (in two programs, their shares summed after) or
    "group, dq and dk apart" (dq, dk and dg each in launches of their own)."""
    if form == "per head":
        monkeypatch.setattr(plan_gla, "GROUP_GRADS_MIN_HEADS", None)
        return
    monkeypatch.setattr(plan_gla, "GROUP_GRADS_MIN_HEADS", 2)
    monkeypatch.setattr(plan_gla, "GROUP_GRADS_WAVES", 0)  # the fewest shares: one
    monkeypatch.setattr(plan_gla, "GROUP_GRADS_DG", (2, 4))
    monkeypatch.setattr(plan_gla, "GROUP_GRADS_SIDES", None)
    if form == "group in shares":
        whole = plan_gla.grads_heads
        monkeypatch.setattr(plan_gla, "grads_heads", lambda *a: max(1, whole(*a) // 2))
    elif form == "group, dg with dq and dk":
        monkeypatch.setattr(plan_gla, "GROUP_GRADS_DG", None)
    elif form == "group, dq and dk apart":
        monkeypatch.setattr(plan_gla, "GROUP_GRADS_SIDES", 4)
    else:
        assert form == "group", form


def assert_the_backward_read_the_kept_states(group_prep: bool) -> None:
    """After training with plan.gla.GLA_FORWARD_STATES: every forward that kept chunk states kept
    them unfilled in the test's dtype (float32 under the interpreter), and every backward built
    ran no recompute sweep nor a side stream, its recompute the group prep alone where
    ``group_prep`` (the reverse sweep reads its scores), else nothing."""
    import torch

    from recurscan.launch import delta as launch_delta
    from recurscan.launch import gla as launch_gla
    kept = [b.buffers["chunk_states"] for b in launch_gla.GLA_SWEEP_LAUNCHES.values() if "chunk_states" in b.buffers]
    assert kept and all(spec[1] == torch.float32 and spec[2] is None for spec in kept)
    built = list(launch_gla.GLA_BACKWARD_LAUNCHES.values())
    assert built and not any(b.corun for b in built)
    for b in built:
        assert (b.forward is not None) == group_prep
        assert b.forward is None or not any(launch_delta.is_sweep_step(st) for st in b.forward.steps)
