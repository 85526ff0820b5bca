"""The operator browser tests' settings: the e2e ones with a slow sampler (a tick every 5 s), so that a figure
which shows sooner than that can only have come through the failure watch (dashboard/sampler.py)."""

from tests.dashboard.e2e_settings import *  # noqa: F403

CHASQUI_SAMPLER_INTERVAL = 5.0
