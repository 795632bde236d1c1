"""Fixtures of the GPU tests (``pytest -m gpu`` on the H200)."""
import pytest
import torch


@pytest.fixture
def gluon_only():
    """Skips a test of a Gluon twin where Gluon twins may not run (plan.device.gluon_usable)."""
    from recurscan.plan.device import gluon_usable
    if not gluon_usable(torch.device("cuda")):
        pytest.skip("Gluon twins run on sm_90 with a tested Triton (plan.device.gluon_usable)")
