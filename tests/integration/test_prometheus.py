"""A real Prometheus scrapes the running service: every recording rule and dashboard query returns data."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import quote
from urllib.request import urlopen

import pytest
import yaml

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker, free_port
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.deploy import RULES, dashboard_expressions, recorded_names
from tests.support.service import Service, wait_for_messages
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def query(port: int, expr: str) -> list[dict[str, object]]:
    body = urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={quote(expr)}", timeout=10).read()  # noqa: S310
    reply = json.loads(body)
    assert reply["status"] == "success", reply
    result: list[dict[str, object]] = reply["data"]["result"]
    return result


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
    sender = threading.Thread(target=produce, args=(kafka.bootstrap, topic, messages),
                              kwargs={"paced": True, "rate": 300.0})
    sender.start()

    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
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
        expressions = sorted(recorded_names()) + [e.replace("$k", "10") for e in dashboard_expressions()]
        missing = list(expressions)
        deadline = time.monotonic() + 120
        while missing and time.monotonic() < deadline:
            time.sleep(2)
            try:
                missing = [expr for expr in missing if not query(port, expr)]
            except OSError:
                continue
        log_tail = (tmp_path / "prometheus.log").read_text()[-2000:]
        assert not missing, f"no data from Prometheus for: {missing}\n{log_tail}"
        up = query(port, 'up{job="stream-ndcg"}')
        assert up and up[0]["value"][1] == "1"  # type: ignore[index]
        sender.join()
        wait_for_messages(service, len(messages))
        # Variant A ranks better by construction, and Prometheus says so.
        by_variant = {r["metric"]["variant"]: float(r["value"][1])  # type: ignore[index]
                      for r in query(port, 'stream_ndcg:ndcg:mean_by_variant{k="10", window="1d"}')}
        assert by_variant["A"] > by_variant["B"]
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        sender.join()
