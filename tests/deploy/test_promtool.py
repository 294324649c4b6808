"""promtool on what Prometheus reads: the rules file and its unit tests, and the exporter's exposition."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from prometheus_client import generate_latest

from tests.support.deploy import DEPLOY, promtool, rules
from tests.support.exporter import T0, build, event, feed

pytestmark = pytest.mark.deploy


def test_rules_pass_promtool_check() -> None:
    result = subprocess.run([promtool(), "check", "rules", "rules.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_promtool_unit_test_and_they_pass() -> None:
    alerts = {r["alert"] for r in rules() if "alert" in r}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "tests" / "rules_test.yml").read_text())
    fired = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if not a["exp_alerts"]}
    assert alerts == fired, f"alerts without a firing test: {alerts - fired}"
    assert alerts == quiet, f"alerts without a test that they stay quiet: {alerts - quiet}"
    result = subprocess.run([promtool(), "test", "rules", "tests/rules_test.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_scrape_passes_promtool_check_metrics() -> None:
    store, engine, registry = build(("variant", "engine"))
    feed(store, engine, [
        event(type="impression", impression_id="i", query_id="q", ts=T0, results=["a", "b"],
              segment={"variant": "A", "engine": "web"}),
        event(type="judgment", query_id="q", doc_id="a", grade=2, ts=T0),
    ])
    result = subprocess.run([promtool(), "check", "metrics"], input=generate_latest(registry),
                            capture_output=True, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert not result.stdout.strip() and not result.stderr.strip(), (result.stdout + result.stderr).decode()
