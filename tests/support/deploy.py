"""The deploy/ files read as data: the dashboard's queries and the Prometheus rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of the Grafana dashboard, `$k` still in them."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "stream-ndcg.json").read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def rules() -> list[dict[str, Any]]:
    """Every recording and alerting rule of rules.yml."""
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    """The series the recording rules write."""
    return {rule["record"] for rule in rules() if "record" in rule}
