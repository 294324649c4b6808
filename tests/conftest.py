"""Shared test settings: hypothesis profiles (CI runs the same number of examples as a developer), and
the real servers' fixtures (tests/support/servers.py), which start nothing until a test asks for them.

The tiers, each a folder and a marker, in the order `make test` runs them:
tests/unit (hermetic: no network, no server or tool in a subprocess; tests/unit/conftest.py enforces it),
tests/integration (markers kafka, redis: real servers on loopback), tests/deploy (marker deploy: helm,
checkov, promtool, the Kubernetes and Prometheus Operator schemas), tests/browser (marker browser:
headless Chromium) and tests/fuzz (marker fuzz: atheris); and, with a target of its own,
tests/simulation (marker simulation: streams simulated for a day, minutes of CPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["tests.support.servers"]

# Generation on a shared 2-core machine is slow at times; the properties, not the timing, are under test.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

TESTS = Path(__file__).resolve().parent
# The tiers whose folder and marker must name the same tests, so that `-m deploy` selects tests/deploy.
TIER_MARKERS = ("deploy", "browser", "fuzz", "simulation")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        for marker in TIER_MARKERS:
            if (item.get_closest_marker(marker) is not None) != (folder == marker):
                raise pytest.UsageError(f"{item.nodeid}: the marker {marker} goes with the folder tests/{marker}, "
                                        "on every test there and on none elsewhere")
