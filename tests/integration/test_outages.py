"""Outages of Kafka and of Redis are waited out: not ready, said in the logs, no busy loop, no exit,
and the numbers afterwards are the uninterrupted ones."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, killed_at_exit, service_environment, wait_for_messages
from tests.support.topics import create_topic
from tests.support.wait import holds, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

OUTAGE_S = 12.0
# A process that waits uses a little CPU for heartbeats and reconnects; one that spins uses a core.
MOST_CPU_SHARE_WHILE_WAITING = 0.15


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_out(service: Service, outage: str) -> float:
    """Until the service says it is not ready; then the share of a core it used during the outage."""
    process = service.process
    assert process is not None
    wait_until(lambda: not service.ready(), 30, f"the service saying not ready in the {outage} outage")
    # The outage's length is what is tested: all along, the service waits, not ready and alive.
    started, cpu = time.monotonic(), cpu_seconds(process.pid)
    holds(lambda: process.poll() is None and not service.ready(), OUTAGE_S,
          f"the service alive and not ready while {outage} is down", interval=0.5)
    return (cpu_seconds(process.pid) - cpu) / (time.monotonic() - started)


def test_kafka_and_redis_outages_are_waited_out_without_spinning(tmp_path: Path) -> None:
    messages = simulated(9_000, seed=71)
    thirds = [messages[i * 3_000:(i + 1) * 3_000] for i in range(3)]
    with KafkaBroker.start(tmp_path / "kafka") as kafka, RedisServer.start(tmp_path / "redis") as redis_server:
        topic = create_topic(kafka.bootstrap, partitions=2)
        service = Service(service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                                              STREAM_NDCG_WINDOWS="1d"), tmp_path)
        with killed_at_exit([service]):
            service.start()
            produce(kafka.bootstrap, topic, thirds[0])
            wait_for_messages(service, 3_000)
            assert service.ready()

            kafka.stop()
            kafka_share = wait_out(service, "Kafka")
            kafka.launch()
            produce(kafka.bootstrap, topic, thirds[1])
            wait_for_messages(service, 6_000)

            redis_server.stop()
            redis_share = wait_out(service, "Redis")
            redis_server.launch()
            produce(kafka.bootstrap, topic, thirds[2])
            samples = wait_for_messages(service, 9_000)

            print(f"outages: {OUTAGE_S:.0f} s of Kafka down used {kafka_share:.1%} of a core, "
                  f"{OUTAGE_S:.0f} s of Redis down {redis_share:.1%}")
            assert kafka_share < MOST_CPU_SHARE_WHILE_WAITING
            assert redis_share < MOST_CPU_SHARE_WHILE_WAITING
            assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
            wait_until(service.ready, 30, "the service ready again after both came back")
            logs = service.logs()
            assert "Kafka group coordinator unreachable; retrying in" in logs
            assert "Redis" in logs and "retrying in" in logs.split("Kafka group coordinator unreachable")[-1]
            assert service.stop() == 0
