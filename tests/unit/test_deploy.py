"""The deploy/ files, checked statically as data (no Docker engine here); helm, checkov and promtool check
them, and the docs site's runbook pages are checked against the alerts, in tests/deploy."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client import CollectorRegistry

from stream_ndcg.config import Settings
from stream_ndcg.engine import Engine
from stream_ndcg.events import parse_event
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.state.cache import StateCache
from stream_ndcg.state.memory import MemoryStore
from tests.support.batches import apply_batch
from tests.support.deploy import DEPLOY, ROOT, compose, dashboard_expressions, recorded_names, rules
from tests.support.events import IMPRESSION, JUDGMENT, encode


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


def test_the_compose_values_match_the_compose_service() -> None:
    values = yaml.safe_load((DEPLOY / "compose-values.yaml").read_text())
    settings = Settings.load(environ=compose()["services"]["stream-ndcg"]["environment"])
    assert tuple(values["config"]["segment_labels"]) == settings.segment_labels
    assert tuple(values["config"]["k"]) == settings.k


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
    documents = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "stream-ndcg.yaml").read_text()) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e["value"] for e in container["env"] if e["name"] != "STREAM_NDCG_CONFIG"}
    settings = Settings.load(environ=env)
    assert container["ports"][0]["containerPort"] == settings.metrics_port
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["spec"]["ports"][0]["port"] == settings.metrics_port
    # Without the Operator: no custom resources, and the Secret is the user's.
    assert {d["kind"] for d in documents} == {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}


# The series Prometheus stores for each metric type the exporter uses.
SERIES_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "info": ("_info",),
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
                                         segment_labels=("variant",), event_clock=True),
             state_cache=StateCache(most_groups=10, most_bytes=2**20).figures)
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
        # The health row's target count reads only what Prometheus writes itself.
        assert names or re.fullmatch(r'sum\(up\{job=~"\$job"\}\)', expr), expr
        assert names <= known, f"{expr} queries series nobody writes: {names - known}"


def test_rules_query_only_series_the_exporter_or_other_rules_write() -> None:
    known = exported_names() | recorded_names()
    for rule in rules():
        # A rule may read only what Prometheus writes itself (`up`); no stream_ndcg name is then fine.
        names = set(METRIC_NAME.findall(rule["expr"]))
        assert names <= known, f"{rule.get('record') or rule['alert']} reads series nobody writes: {names - known}"


def test_dashboard_panels_are_described_filterable_and_use_the_datasource_variable() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "stream-ndcg.json").read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    # compose-values.yaml exports the segment labels variant and engine: one variable each.
    assert {"datasource", "pipeline", "k", "window", "job", "variant", "engine"} <= variables
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert "Service health" in {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    for panel in panels:
        assert panel["description"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        for target in panel["targets"]:
            assert not re.search(r"\[\d+[smh]\]", target["expr"]), f"a fixed range, not $__rate_interval: {target}"
            if "stream_ndcg_" in target["expr"] and "_bucket" not in target["expr"] and "job" not in target["expr"]:
                assert 'pipeline=~"$pipeline"' in target["expr"], target["expr"]
    assert any(a.get("expr", "").startswith("count by (job, version, revision)")
               for a in dashboard["annotations"]["list"])


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in DEPLOY.rglob("*.yml")))
def test_every_yaml_file_parses(path: str) -> None:
    assert yaml.safe_load((ROOT / path).read_text()) is not None
