"""Shared test settings: hypothesis profiles (CI runs the same number of examples as a developer)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Generation on a shared 2-core machine is slow at times; the properties, not the timing, are under test.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
