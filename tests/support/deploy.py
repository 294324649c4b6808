"""The deploy/ files read as data (the dashboard's queries, the Prometheus rules, the compose file),
and the tools that check them (promtool, helm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
CHART = DEPLOY / "helm" / "stream-ndcg"


def tool(variable: str, name: str) -> str:
    """The binary `make helm` / `make checkov` put in the cache (the Makefile exports its path)."""
    path = os.environ.get(variable) or shutil.which(name)
    assert path and Path(path).is_file(), f"{name} is needed: run `make {name}` (make test does)"
    return path


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("HELM", "helm"), *args], capture_output=True, text=True, check=False)


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is needed (Debian: apt-get install prometheus); .ci/run installs it"
    return path


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return document


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of the Grafana dashboard, `$k` still in them."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "stream-ndcg.json").read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    """Every recording and alerting rule of rules.yml."""
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    """The series the recording rules write."""
    return {rule["record"] for rule in rules() if "record" in rule}
