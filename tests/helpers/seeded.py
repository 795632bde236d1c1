"""The property tests' seed loop: case i is drawn from seed i, so a failure names its seed and
``RECURSCAN_PROPERTY_SEED=i`` replays it alone; otherwise seeds run in order until
``RECURSCAN_PROPERTY_SECONDS`` (default 40 s) is spent."""
import os
import time

import torch

BUDGET = float(os.environ.get("RECURSCAN_PROPERTY_SECONDS", "40"))
ONE_SEED = os.environ.get("RECURSCAN_PROPERTY_SEED")


def run_seeds(cases: list, run, path: str) -> int:
    """``run(rng, case)`` for seed 0, 1, ... with ``case = cases[seed % len(cases)]`` (a tuple whose
    first two entries name it) and ``rng`` a generator seeded with the seed, until the budget is
    spent; at least one round of ``cases`` must fit in it. ``path``: the test file, for the replay
    line. Returns how many cases ran."""
    seeds = [int(ONE_SEED)] if ONE_SEED is not None else range(10**6)
    start, ran = time.monotonic(), 0
    for seed in seeds:
        if ONE_SEED is None and time.monotonic() - start > BUDGET:
            break
        case = cases[seed % len(cases)]
        try:
            run(torch.Generator().manual_seed(seed), case)
        except Exception as exc:
            raise AssertionError(f"seed {seed} ({case[0]}, {case[1]}): {type(exc).__name__}: {exc}\n"
                                 f"replay: RECURSCAN_PROPERTY_SEED={seed} pytest {path}") from exc
        ran += 1
    assert ONE_SEED is not None or ran >= len(cases), f"only {ran} cases in {BUDGET} s"
    return ran
