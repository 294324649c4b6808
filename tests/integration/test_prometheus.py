"""A real Prometheus scrapes the running service and evaluates the chart's PrometheusRule: every
rule evaluates without error, every recording rule and every dashboard query (its variables
substituted as Grafana would) returns data, and a live scrape passes `promtool check metrics`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote
from urllib.request import urlopen

import pytest
import yaml

from stream_ndcg.devtools.ports import free_port
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.deploy import CHART, DEPLOY, helm, promtool
from tests.support.service import Service, wait_for_messages
from tests.support.topics import create_topic, send_paced
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def query(port: int, expr: str) -> list[dict[str, object]]:
    body = urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={quote(expr)}", timeout=10).read()  # noqa: S310
    reply = json.loads(body)
    assert reply["status"] == "success", reply
    result: list[dict[str, object]] = reply["data"]["result"]
    return result


def chart_rules_and_dashboard(namespace: str) -> tuple[dict[str, Any], list[str]]:
    """The PrometheusRule's rules and the dashboard's queries as the chart renders them, for the
    service's settings (deploy/compose-values.yaml: k 5,10; windows 5m,1h,1d; variant, engine),
    with the dashboard variables substituted: one pipeline, k 10, all windows and segments."""
    result = helm("template", "stream-ndcg", str(CHART), "-f", str(DEPLOY / "compose-values.yaml"))
    assert result.returncode == 0, result.stderr
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    rules: dict[str, Any] = next(d for d in documents if d["kind"] == "PrometheusRule")["spec"]
    dashboard = json.loads(next(d for d in documents if d["kind"] == "ConfigMap")["data"]["stream-ndcg.json"])
    variables = {"$__rate_interval": "1m", "$pipeline": namespace, "$k": "10", "$window": ".*", "$variant": ".*",
                 "$engine": ".*", "$job": "stream-ndcg"}
    names = {v["name"] for v in dashboard["templating"]["list"]} - {"datasource"}
    assert {name.lstrip("$") for name in variables} - {"__rate_interval"} == names
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            # Longest first, so that $k does not eat the start of another name.
            for name in sorted(variables, key=len, reverse=True):
                expr = expr.replace(name, variables[name])
            assert "$" not in expr, expr
            queries.append(expr)
    return rules, queries


def test_rules_and_dashboard_queries_return_data_from_a_real_prometheus(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    assert binary, "the Prometheus server is needed (Debian: apt-get install prometheus); .ci/run installs it"
    topic = create_topic(kafka.bootstrap, partitions=2)
    service = Service(dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="5m,1h,1d",
                           STREAM_NDCG_SEGMENT_LABELS="variant,engine"), tmp_path)
    services.append(service)
    service.start()
    spec = SimulationSpec(events=6_000, seed=8, queries=200, rate=200.0, engines=("web", "app"),
                          malformed_share=0.01, max_delay_ms=300_000)
    messages = list(Simulator(spec).messages())
    # Traffic keeps flowing while Prometheus scrapes, so rates are taken over moving counters.
    sender = send_paced(kafka.bootstrap, topic, messages, 300.0)

    rules, queries = chart_rules_and_dashboard(service_env["STREAM_NDCG_NAMESPACE"])
    # Evaluated every second here, so that the test does not wait for the chart's 30 s.
    for group in rules["groups"]:
        group.pop("interval", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "stream-ndcg",
                            "static_configs": [{"targets": [f"127.0.0.1:{service.port}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        prometheus = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    try:
        records = [r["record"] for group in rules["groups"] for r in group["rules"] if "record" in r]
        missing = records + queries

        def all_answered() -> bool:
            nonlocal missing
            try:
                missing = [expr for expr in missing if not query(port, expr)]
            except OSError:
                return False
            return not missing

        wait_until(all_answered, 120, lambda: f"data from Prometheus for every query; none yet for {missing}\n"
                                              f"{(tmp_path / 'prometheus.log').read_text()[-2000:]}", interval=2)
        up = query(port, 'up{job="stream-ndcg"}')
        assert up and up[0]["value"][1] == "1"  # type: ignore[index]
        # Every rule evaluates without error (a many-to-many match, a bad label, ...), the alerts
        # are loaded, and none of them fires against a healthy service.
        groups = json.loads(urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10).read())["data"]["groups"]  # noqa: S310
        loaded = [r for g in groups for r in g["rules"]]
        assert len(loaded) == sum(len(g["rules"]) for g in rules["groups"])
        assert not [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
        assert not [r["name"] for r in loaded if r["type"] == "alerting" and r["state"] == "firing"]
        scrape = urlopen(f"http://127.0.0.1:{service.port}/metrics", timeout=10).read()  # noqa: S310
        check = subprocess.run([promtool(), "check", "metrics"], input=scrape, capture_output=True, check=False)
        assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check
        sender.join()
        wait_for_messages(service, len(messages))
        # Variant A ranks better by construction, and Prometheus says so.
        by_variant = {r["metric"]["variant"]: float(r["value"][1])  # type: ignore[index]
                      for r in query(port, 'stream_ndcg:ndcg:mean_by_segment{k="10", window="1d"}')}
        assert by_variant["A"] > by_variant["B"]
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        sender.join()
