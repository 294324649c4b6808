"""The deploy/ files, checked statically (no Docker engine here) and with promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from stream_ndcg.config import Settings
from stream_ndcg.engine import Engine
from stream_ndcg.events import parse_event
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.store import MemoryStore
from tests.support.batches import apply_batch
from tests.support.deploy import DEPLOY, ROOT, dashboard_expressions, recorded_names, rules
from tests.support.events import IMPRESSION, JUDGMENT, encode


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is needed (Debian: apt-get install prometheus); .ci/run installs it"
    return path


def test_rules_pass_promtool_check() -> None:
    result = subprocess.run([promtool(), "check", "rules", "rules.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_promtool_unit_test_and_they_pass() -> None:
    alerts = {r["alert"] for r in rules() if "alert" in r}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "tests" / "rules_test.yml").read_text())
    fired = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if a["exp_alerts"]}
    assert alerts == fired, f"alerts without a firing test: {alerts - fired}"
    result = subprocess.run([promtool(), "test", "rules", "tests/rules_test.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_annotations_and_a_runbook_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
               for line in readme.splitlines() if line.startswith("#")}
    for rule in (r for r in rules() if "alert" in r):
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        assert annotations["runbook_url"] == f"README.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in anchors, f"README has no runbook section for {rule['alert']}"


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return document


def test_compose_images_are_pinned_and_services_complete() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "redis", "stream-ndcg", "simulator", "prometheus", "grafana"}
    for name, service in services.items():
        image = service.get("image", "")
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), (name, image)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "--appendonly" in services["redis"]["command"] and "everysec" in services["redis"]["command"]
    assert services["simulator"]["profiles"] == ["simulator"]
    assert services["stream-ndcg"]["build"] == "."


def test_compose_service_configuration_is_valid_and_lines_up_with_prometheus_and_grafana() -> None:
    services = compose()["services"]
    env = services["stream-ndcg"]["environment"]
    settings = Settings.load(environ=env)
    assert settings.metrics_host == "0.0.0.0"  # noqa: S104 - must be reachable from the Prometheus container
    assert f"{settings.metrics_port}:{settings.metrics_port}" in services["stream-ndcg"]["ports"]
    kafka_port = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].rsplit(":", 1)[1]
    assert settings.bootstrap_servers == f"kafka:{kafka_port}"
    assert settings.redis_url.startswith("redis://redis:6379")
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"stream-ndcg:{settings.metrics_port}"]
    assert scrape["rule_files"] == ["rules.yml"]
    mounts = services["prometheus"]["volumes"]
    assert "./deploy/prometheus/rules.yml:/etc/prometheus/rules.yml:ro" in mounts
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]
    for mount in (v for s in services.values() for v in s.get("volumes", []) if v.startswith("./")):
        assert (ROOT / mount.split(":")[0]).exists(), mount
    simulate = services["simulator"]["command"]
    assert simulate[simulate.index("--bootstrap-servers") + 1] == settings.bootstrap_servers
    assert simulate[simulate.index("--topic") + 1] in settings.topics


def test_dockerfile_is_slim_non_root_with_a_health_check() -> None:
    text = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert bases and all(re.search(r":\d+\.\d+\.\d+-slim", base) for base in bases), bases
    user = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*", text, re.MULTILINE)
    assert "/healthz" in text
    port = re.search(r"^EXPOSE (\d+)", text, re.MULTILINE)
    assert port and f"STREAM_NDCG_METRICS_PORT={port.group(1)}" in text
    assert f"127.0.0.1:{port.group(1)}/healthz" in text


def test_kubernetes_manifest_has_probes_on_the_metrics_port() -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "stream-ndcg.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = Settings.load(environ=env)
    assert container["ports"][0]["containerPort"] == settings.metrics_port
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(settings.metrics_port)


# The series Prometheus stores for each metric type the exporter uses.
SERIES_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
                   "histogram": ("_bucket", "_sum", "_count", "_created")}
METRIC_NAME = re.compile(r"stream_ndcg[:_][a-z_:0-9]+")


def exported_names() -> set[str]:
    """Every series name a real Exporter exposes, read from a fresh registry over a store holding
    an impression and a judgment (families without children yet are named by their type's suffixes)."""
    store = MemoryStore()
    engine = Engine(Measure(cutoffs=(10,)))
    apply_batch(store, engine, "t:0", [parse_event(encode(IMPRESSION)), parse_event(encode(JUDGMENT)),
                                       parse_event(b"not json")], epoch=store.claim("t:0"), next_offset=3)
    registry = CollectorRegistry()
    Exporter(registry, store, WindowView(cutoffs=(10,), windows_ms=(3_600_000,), bucket_ms=60_000,
                                         segment_labels=("variant",), event_clock=True))
    families = list(registry.collect())
    samples = {sample.name for family in families for sample in family.samples}
    assert "stream_ndcg_ndcg" in samples and "stream_ndcg_events_rejected_total" in samples, samples
    return samples | {family.name + suffix for family in families for suffix in SERIES_SUFFIXES[family.type]}


def test_dashboard_parses_and_queries_known_metrics() -> None:
    exprs = dashboard_expressions()
    assert len(exprs) >= 10
    known = exported_names() | recorded_names()
    for expr in exprs:
        names = set(METRIC_NAME.findall(expr))
        assert names, expr
        assert names <= known, f"{expr} queries series nobody writes: {names - known}"


def test_rules_query_only_series_the_exporter_or_other_rules_write() -> None:
    known = exported_names() | recorded_names()
    for rule in rules():
        # A rule may read only what Prometheus writes itself (`up`); no stream_ndcg name is then fine.
        names = set(METRIC_NAME.findall(rule["expr"]))
        assert names <= known, f"{rule.get('record') or rule['alert']} reads series nobody writes: {names - known}"


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in DEPLOY.rglob("*.yml")))
def test_every_yaml_file_parses(path: str) -> None:
    assert yaml.safe_load((ROOT / path).read_text()) is not None
