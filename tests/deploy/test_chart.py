"""The Helm chart: lint, render, validate every object against the Kubernetes and Prometheus
Operator schemas, scan with checkov, and keep the files generated from it up to date."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from stream_ndcg.config import Settings
from tests.support.deploy import CHART, DEPLOY, ROOT, helm, promtool, tool

pytestmark = pytest.mark.deploy

MAXIMAL = CHART / "ci" / "maximal-values.yaml"
KUBERNETES_VERSION = "1.31.0"
# The Prometheus Operator release whose CRDs the chart's ServiceMonitor and PrometheusRule must fit.
OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
VALUES = {"default": [], "maximal": ["-f", str(MAXIMAL)]}


def render(values: str, *extra: str) -> list[dict[str, Any]]:
    result = helm("template", "search", str(CHART), "--namespace", "search", *VALUES[values], *extra)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def of(documents: list[dict[str, Any]], kind: str, component: str = "run") -> dict[str, Any]:
    """The one object of `kind` of a component (run, judge, ubi-bridge)."""
    (document,) = [d for d in documents if d["kind"] == kind
                   and d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return document


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint(values: str) -> None:
    result = helm("lint", "--strict", str(CHART), *VALUES[values])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def operator_schemas() -> dict[str, dict[str, Any]]:
    """openAPIV3Schema by apiVersion and kind, from the operator's CRDs in the Go module cache (the module proxy
    is how they reach a machine without GitHub), made strict: unknown fields are errors."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    result = subprocess.run([go, "mod", "download", "-json", OPERATOR_MODULE], capture_output=True, text=True,
                            check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    crds = Path(json.loads(result.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    schemas = {}
    for path in crds.glob("*.yaml"):
        crd = yaml.load(path.read_text(), Loader=_CrdLoader)  # noqa: S506 - a safe loader, see below
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[f"{api_version} {crd['spec']['names']['kind']}"] = _strict(version["schema"]["openAPIV3Schema"])
    assert {"monitoring.coreos.com/v1 ServiceMonitor", "monitoring.coreos.com/v1 PrometheusRule"} <= set(schemas)
    return schemas


class _CrdLoader(yaml.SafeLoader):
    """SafeLoader that reads `=` (an enum value in the operator's CRDs) as the string it is;
    PyYAML otherwise takes it for the YAML 1.1 "value" tag and fails."""


def _scalar(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    assert isinstance(node, yaml.ScalarNode)
    return loader.construct_scalar(node)


_CrdLoader.add_constructor("tag:yaml.org,2002:value", _scalar)


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_object_fits_its_schema(values: str, operator_schemas: dict[str, dict[str, Any]]) -> None:
    documents = render(values)
    kinds = sorted(d["kind"] for d in documents)
    # The maximal values run the judge and the bridge too: a Deployment, Service, ServiceMonitor,
    # NetworkPolicy and PodDisruptionBudget each.
    per_component = ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    components = 3 if values == "maximal" else 1
    assert kinds == sorted(["ConfigMap", "PrometheusRule", "Secret"] + per_component * components)
    for document in documents:
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            # Not jsonschema.validate: it checks the schema too, and the CRDs' patterns are Go regexps.
            schema = operator_schemas[f"{document['apiVersion']} {document['kind']}"]
            jsonschema.Draft7Validator(schema).validate(document)
        else:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_rollout_is_kubernetes_default_unless_a_strategy_is_set() -> None:
    def strategy(values: str) -> Any:
        return of(render(values), "Deployment")["spec"].get("strategy")

    assert strategy("default") is None
    assert strategy("maximal") == {"type": "Recreate"}


@pytest.mark.parametrize("values", VALUES)
def test_the_pod_meets_the_restricted_pod_security_standard(values: str) -> None:
    deployments = [d for d in render(values) if d["kind"] == "Deployment"]
    assert len(deployments) == (3 if values == "maximal" else 1)
    for deployment in deployments:
        check_restricted_pod(deployment, values)


def check_restricted_pod(deployment: dict[str, Any], values: str) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert not [e for e in container["env"] if "valueFrom" in e], "secrets go in the mounted file, not the env"
    if values == "maximal":
        assert "@sha256:" in container["image"]


@pytest.mark.parametrize("values", VALUES)
def test_the_environment_and_secret_file_are_valid_settings(values: str, tmp_path: Path) -> None:
    documents = render(values)
    container = of(documents, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    secret = next(d for d in documents if d["kind"] == "Secret")
    settings_file = tmp_path / "secrets.toml"
    settings_file.write_text(secret["stringData"]["secrets.toml"])
    settings = Settings.load(environ=dict(env, STREAM_NDCG_CONFIG=str(settings_file)))
    assert settings.metrics_port == container["ports"][0]["containerPort"]
    assert settings.redis_url.startswith(("redis://", "rediss://"))
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert settings.api_port == ports["api"] and settings.api_host == "0.0.0.0"  # noqa: S104 - in a pod, by design
    if values == "maximal":
        assert settings.sasl_password == 'pa"ss' and settings.segment_labels == ("experiment", "engine", "locale")
        assert settings.api_token == "drill-token"
        assert (settings.state_cache_groups, settings.state_cache_mib) == (50000, 384)
        policy = of(documents, "NetworkPolicy")
        assert {"port": "api", "protocol": "TCP"} in policy["spec"]["ingress"][1]["ports"]
    monitor = of(documents, "ServiceMonitor")
    service = of(documents, "Service")
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


COMPONENTS = ("run", "judge", "ubi-bridge")
STAGES = ("--set", "judge.enabled=true,ubiBridge.enabled=true")


def test_the_stages_run_their_command_with_their_config_over_the_shared_one(tmp_path: Path) -> None:
    documents = render("maximal")
    settings_file = tmp_path / "secrets.toml"
    settings_file.write_text(next(d for d in documents if d["kind"] == "Secret")["stringData"]["secrets.toml"])
    loaded = {}
    for component in ("judge", "ubi-bridge"):
        deployment = of(documents, "Deployment", component)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["args"] == [component] and deployment["spec"]["replicas"] == 2
        env = {e["name"]: e["value"] for e in container["env"]}
        assert not [name for name in env if name.startswith("STREAM_NDCG_API_")], "only run serves the API"
        assert [port["name"] for port in container["ports"]] == ["metrics"]
        settings = Settings.load(environ=dict(env, STREAM_NDCG_CONFIG=str(settings_file)))
        assert settings.metrics_port == container["ports"][0]["containerPort"]
        # The connection and its SASL credentials are shared with run.
        assert settings.bootstrap_servers.startswith("kafka-0.kafka:9093") and settings.sasl_password == 'pa"ss'
        loaded[component] = settings
    # The stage's own values win over the shared ones (log_level is DEBUG in `config`).
    assert loaded["judge"].batch_size == 500 and loaded["judge"].log_level == "INFO"
    bridge = loaded["ubi-bridge"]
    assert bridge.ubi_group_id == "ndcg-web-ubi-bridge" != bridge.group_id
    assert bridge.ubi_output_topic in bridge.topics, "the bridge writes to a topic run reads"
    assert bridge.ubi_excluded_clients == ("quepid-*", "*-bot")
    # A stage's false is not replaced by a shared true.
    overridden = render("default", "--set",
                        "config.redis_cluster=true,judge.enabled=true,judge.config.redis_cluster=false")
    env = of(overridden, "Deployment", "judge")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "STREAM_NDCG_REDIS_CLUSTER", "value": "false"} in env


@pytest.mark.parametrize("values", VALUES)
def test_every_selector_of_a_component_picks_its_own_pods_only(values: str) -> None:
    documents = render(values, *STAGES)
    # Run's Deployment selector is immutable: it stays what releases without the stages have.
    assert of(documents, "Deployment")["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "stream-ndcg", "app.kubernetes.io/instance": "search"}
    pods = {c: of(documents, "Deployment", c)["spec"]["template"]["metadata"]["labels"] for c in COMPONENTS}
    services = {c: of(documents, "Service", c)["metadata"]["labels"] for c in COMPONENTS}
    for component in COMPONENTS:
        selectors = [of(documents, "Deployment", component)["spec"]["selector"]["matchLabels"],
                     of(documents, "Service", component)["spec"]["selector"],
                     of(documents, "PodDisruptionBudget", component)["spec"]["selector"]["matchLabels"],
                     of(documents, "NetworkPolicy", component)["spec"]["podSelector"]["matchLabels"]]
        for selector in selectors:
            assert [c for c, labels in pods.items() if selects(selector, labels)] == [component], selector
        monitor = of(documents, "ServiceMonitor", component)["spec"]["selector"]["matchLabels"]
        assert [c for c, labels in services.items() if selects(monitor, labels)] == [component], monitor


def test_the_network_policies_let_each_component_reach_what_it_needs() -> None:
    documents = render("maximal")

    def egress_ports(component: str) -> set[int]:
        policy = of(documents, "NetworkPolicy", component)["spec"]
        assert [rule["ports"] for rule in policy["ingress"]][0] == [{"port": "metrics", "protocol": "TCP"}]
        return {port["port"] for rule in policy["egress"] for port in rule["ports"]}

    # Kafka on 9093, Redis on 6379 and 16379 (Cluster bus), DNS on 53: the bridge keeps no state in Redis.
    assert egress_ports("run") == egress_ports("judge") == {9093, 6379, 16379, 53}
    assert egress_ports("ubi-bridge") == {9093, 53}
    assert len(of(documents, "NetworkPolicy", "ubi-bridge")["spec"]["ingress"]) == 1, "no API to reach"


def test_with_a_page_url_every_series_split_by_segment_links_to_its_drill_down() -> None:
    documents = render("maximal")
    config_map = next(d for d in documents if d["kind"] == "ConfigMap" and "stream-ndcg.json" in d.get("data", {}))
    dashboard = json.loads(config_map["data"]["stream-ndcg.json"])
    linked = [panel["title"] for panel in dashboard["panels"] if panel.get("fieldConfig", {}).get("defaults", {})
              .get("links")]
    assert linked == ["nDCG@$k by window and segment", "Impressions in window"]
    url = dashboard["panels"][[p["title"] for p in dashboard["panels"]].index(linked[0])]["fieldConfig"]["defaults"][
        "links"][0]["url"]
    assert url.startswith("https://ndcg.example.com/#window=${__field.labels.window}&k=${k}&")
    assert all(f"segment.{label}=${{__field.labels.{label}}}" in url for label in ("experiment", "engine", "locale"))
    default = next(d for d in render("default") if d["kind"] == "ConfigMap" and "stream-ndcg.json" in d["data"])
    assert "Drill down" not in default["data"]["stream-ndcg.json"]


@pytest.mark.parametrize("values", VALUES)
def test_the_prometheus_rule_passes_promtool_and_follows_the_values(values: str, tmp_path: Path) -> None:
    documents = render(values)
    rule = next(d for d in documents if d["kind"] == "PrometheusRule")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yml")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    text = "\n".join(str(v) for r in rules for v in (r["expr"], *r.get("annotations", {}).values()))
    if values == "maximal":
        assert 'k="5", window="6h"' in text and 'window="7d"' in text and "experiment" in text
        assert "max by (pipeline, k, window, experiment, engine, locale)" in text
        assert "https://docs.example.com/stream-ndcg/runbooks/down/#streamndcgdown" in text
        assert 'up{job="ndcg-web", namespace="search"}' in text
        assert 'experiment!="baseline"' in text and "0.01 / (count by" in text and "/ 50000" in text
        assert "StreamNdcgSegmentBelowAnother" in {r.get("alert") for r in rules}
    else:
        assert 'up{job="search-stream-ndcg", namespace="search"}' in text
        # No control (config.control and alerts.control empty): nothing to compare with.
        assert "difference_from_control" not in text
        assert "StreamNdcgSegmentBelowAnother" not in {r.get("alert") for r in rules}
    assert not [r for r in rules if "record" in r and "instance" in r["expr"]], "recording rules keep no target label"


@pytest.mark.parametrize("override", ["alerts.k=7", "alerts.shortWindow=2h", "alerts.segmentLabel=locale",
                                      "partitions=1",
                                      "replicaCount=1,partitions=1,judge.enabled=true,judge.replicaCount=2"])
def test_values_the_rules_cannot_follow_are_refused(override: str) -> None:
    result = helm("template", "search", str(CHART), "--set", override)
    assert result.returncode != 0 and "is not one of" in result.stderr or "partitions" in result.stderr, \
        result.stderr


@pytest.mark.parametrize(("override", "refusal"), [
    ("alerts.control=engine=web", "is not one of"),
    ("alerts.control=variant", "is not label=value"),
    ("alerts.segmentLabel=variant,alerts.control=engine=web,config.segment_labels={variant,engine}",
     "is not a value of"),
    ("alerts.alpha=1.5", "must be between 0 and 1"),
    ("config.alpha=0", "must be between 0 and 1"),
    ("alerts.nStar=0", "at least 1"),
    ("alerts.nStar=2.5", "at least 1"),
])
def test_comparison_values_the_service_would_refuse_are_refused(override: str, refusal: str) -> None:
    result = helm("template", "search", str(CHART), "--set", f"config.control=variant=A,{override}")
    assert result.returncode != 0 and refusal in result.stderr, result.stderr


def test_the_comparison_alert_follows_the_services_control_alpha_and_n_star() -> None:
    documents = render("default", "--set", "config.control=variant=B,config.alpha=0.02,config.n_star=4000")
    rule = next(d for d in documents if d["kind"] == "PrometheusRule")
    text = "\n".join(r["expr"] for group in rule["spec"]["groups"] for r in group["rules"])
    assert 'variant!="B"' in text and "0.02 / (count by" in text and "/ 4000" in text


def test_the_files_generated_from_the_chart_are_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(DEPLOY / "render.py"), "--check"], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_checkov_finds_no_unexplained_failure(tmp_path: Path) -> None:
    for values in VALUES:
        result = helm("template", "search", str(CHART), "--namespace", "search", *VALUES[values])
        assert result.returncode == 0, result.stderr
        (tmp_path / f"{values}.yaml").write_text(result.stdout)
    scan = subprocess.run([tool("CHECKOV", "checkov"), "--directory", str(tmp_path), "--framework", "kubernetes",
                           "--output", "json", "--skip-download"],
                          capture_output=True, text=True, check=False)
    report = json.loads(scan.stdout)
    summary = report["summary"]
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert summary["failed"] == 0, failed
    assert summary["passed"] > 50
    # Every skip carries its reason in the chart (checkov.io/skip annotations).
    for check in report["results"]["skipped_checks"]:
        assert check["check_result"].get("suppress_comment"), check["check_id"]


def notes(tmp_path: Path, *extra: str) -> str:
    """The chart's NOTES.txt as `helm install` prints it. `helm template` leaves NOTES.txt out and
    `helm install --dry-run` wants a cluster, so a copy of the chart renders it as a template of its
    own: --debug prints it before the YAML parse refuses it."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "templates" / "notes.yaml")
    result = helm("template", "search", str(chart), "--namespace", "search", "--debug",
                  "--show-only", "templates/notes.yaml", *extra)
    assert "# Source: stream-ndcg/templates/notes.yaml" in result.stdout, result.stderr
    return result.stdout.split("# Source: stream-ndcg/templates/notes.yaml", 1)[1]


def test_the_notes_say_how_to_reach_the_service_and_when_the_comparison_alert_is_missing(tmp_path: Path) -> None:
    without_control = notes(tmp_path / "a")
    assert "port-forward svc/search-stream-ndcg 9464" in without_control
    assert "http://127.0.0.1:9465/" in without_control
    assert "StreamNdcgSegmentBelowAnother is not rendered: no control is set" in without_control
    with_control = notes(tmp_path / "b", "--set", "alerts.control=variant=A", "--set", "api.enabled=false")
    assert "port-forward svc/search-stream-ndcg 9464" in with_control
    assert "9465" not in with_control and "not rendered" not in with_control
