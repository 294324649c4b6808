"""Generate the files outside the chart from the chart, or check that they are up to date.

    python deploy/render.py          # write them
    python deploy/render.py --check  # exit 1 if any differs from what the chart renders

The chart (deploy/helm/stream-ndcg) is the one source: the plain Kubernetes manifests, the
Prometheus rules file and the Grafana dashboard of docker-compose are rendered from it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent
CHART = DEPLOY / "helm" / "stream-ndcg"
RELEASE = "stream-ndcg"
NAMESPACE = "stream-ndcg"


def helm() -> str:
    """HELM, else the one `make helm` builds into the cache, else helm on the PATH."""
    cache = Path(os.environ.get("STREAM_NDCG_CACHE", Path.home() / ".cache" / "stream-ndcg"))
    for candidate in (os.environ.get("HELM"), str(cache / "helm-v3.20.2" / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit("helm not found: run `make helm` (it builds it into ~/.cache/stream-ndcg)")


def template(*args: str) -> str:
    result = subprocess.run([helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"helm template failed:\n{result.stderr}")
    return result.stdout


def header(lines: list[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def render() -> dict[Path, str]:
    compose = str(DEPLOY / "compose-values.yaml")
    rule: dict[str, Any] = yaml.safe_load(template("-f", compose, "--show-only", "templates/prometheusrule.yaml"))
    rules = header([
        "Recording and alerting rules of stream-ndcg, for a Prometheus without the Operator.",
        "GENERATED from the chart (deploy/helm/stream-ndcg, templates/_rules.tpl) by `make manifests`",
        "with deploy/compose-values.yaml: edit those and regenerate, not this file. The quality alerts",
        "use one k, two windows and one segment label (`alerts.k`, `alerts.shortWindow`,",
        "`alerts.longWindow`, `alerts.segmentLabel`), which must be among the service's settings",
        "(`config.k`, `config.windows`, `config.segment_labels`), and the comparison alert a control,",
        "alpha and N* (`alerts.control`, `alerts.alpha`, `alerts.nStar`) the service would accept;",
        "rendering fails otherwise.",
    ]) + yaml.safe_dump(rule["spec"], sort_keys=False, width=100)
    configmap: dict[str, Any] = yaml.safe_load(template("-f", compose, "--show-only", "templates/dashboard.yaml"))
    dashboard = json.dumps(json.loads(configmap["data"]["stream-ndcg.json"]), indent=2) + "\n"
    manifests = header([
        "stream-ndcg on Kubernetes without Helm: GENERATED from the chart (deploy/helm/stream-ndcg)",
        "by `make manifests` with deploy/kubernetes/values.yaml; edit those and regenerate.",
    ]) + template("-f", str(DEPLOY / "kubernetes" / "values.yaml"))
    return {
        DEPLOY / "prometheus" / "rules.yml": rules,
        DEPLOY / "grafana" / "dashboards" / "stream-ndcg.json": dashboard,
        DEPLOY / "kubernetes" / "stream-ndcg.yaml": manifests,
    }


def main(argv: list[str]) -> int:
    files = render()
    if "--check" in argv:
        stale = [str(path.relative_to(DEPLOY.parent)) for path, text in files.items()
                 if not path.exists() or path.read_text() != text]
        if stale:
            print(f"out of date with the chart (run `make manifests`): {', '.join(stale)}", file=sys.stderr)
            return 1
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
