"""Experiments on a running service (real Kafka, real Redis): the API's figures of each experiment,
open or closed, equal `stream-ndcg replay --experiments` on the same events to 1e-9."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.replay import assert_close_figures
from tests.support.service import Service, service_environment, wait_for_messages
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def test_the_apis_experiment_figures_equal_the_replays(kafka: KafkaBroker, redis_server: RedisServer,
                                                        services: list[Service], tmp_path: Path) -> None:
    spec = SimulationSpec(events=6_000, seed=61, queries=80, rate=10.0, max_delay_ms=300_000,
                          variants=(("A", 0.5), ("B", 2.0), ("C", 1.0)))
    messages = list(Simulator(spec).messages())
    times = sorted(json.loads(value)["ts"] for _, value in messages if b'"impression"' in value)
    # One open since before the stream, with three arms; one that starts a third in and is closed
    # two thirds in, with late judgments after its end still re-crediting what it counted.
    experiments = (f"name=open,start=0,label=variant,arms=A|B|C,control=A,n_star=3000; "
                   f"name=closed,start={times[len(times) // 3]},end={times[2 * len(times) // 3]},label=variant,"
                   f"arms=A|B,control=B,alpha=0.1")
    topic = create_topic(kafka.bootstrap, partitions=2)
    produce(kafka.bootstrap, topic, messages)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(value + b"\n" for _, value in messages))
    env = service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_K="5,10",
                              STREAM_NDCG_WINDOWS="1h", STREAM_NDCG_EXPERIMENTS=experiments)
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    wait_for_messages(service, len(messages))
    replayed = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "replay", str(events), "--k", "5,10",
                               "--experiments", experiments], check=True, capture_output=True)
    expected = json.loads(replayed.stdout)["experiments"]
    status, listing = service.api("/api/v1/experiments")
    assert status == 200
    assert [experiment["name"] for experiment in listing["experiments"]] == ["open", "closed"]
    for served in listing["experiments"]:
        for k in ("5", "10"):
            arms = served["k"][k]["arms"]
            # Every arm has impressions, and a comparison to show: the check below compares numbers.
            assert all(arm["scored_impressions"] > 0 for arm in arms.values())
            assert all(c["stratified"] is not None for c in served["k"][k]["comparisons"].values())
        assert_close_figures(served, expected[served["name"]], served["name"])
    assert listing["experiments"][1]["open"] is False
    assert service.api("/api/v1/experiments/closed")[1] == listing["experiments"][1]
    assert service.api("/api/v1/experiments/unknown")[0] == 404
    assert service.stop() == 0
