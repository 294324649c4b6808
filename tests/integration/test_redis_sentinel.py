"""Redis Sentinel: the service finds the master through the sentinels and, when the master dies and
a replica is promoted, finds the new one; its numbers still equal the replay."""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_ndcg.devtools.redis_servers import RedisSentinels
from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, progress, service_environment, wait_for_messages
from tests.support.topics import create_topic, send_paced

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinels]:
    group = RedisSentinels.start(tmp_path_factory.mktemp("redis-sentinel"))
    yield group
    group.stop()


def eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.5)


def test_the_master_found_through_sentinels_fails_over_and_no_number_changes(
        kafka: KafkaBroker, sentinels: RedisSentinels, services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(6_000, seed=43)
    # redis_url names no server here: the sentinels do; it still gives the database.
    env = service_environment(kafka.bootstrap, "redis://127.0.0.1:1/0", STREAM_NDCG_TOPICS=topic,
                              STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_REDIS_SENTINELS=sentinels.sentinel_addresses,
                              STREAM_NDCG_REDIS_SENTINEL_MASTER=sentinels.master_name)
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    sender = send_paced(kafka.bootstrap, topic, messages, rate=200.0)
    eventually(lambda: progress(service) >= 1_500, 90, "the first 1,500 messages taken in")

    assert sentinels.master_port() == sentinels.master.port
    sentinels.master.kill()
    # What the test is about: the sentinels promoted the replica.
    eventually(lambda: sentinels.master_port() == sentinels.replica.port, 60, "the replica promoted")
    before = progress(service)
    eventually(lambda: progress(service) >= min(before + 500, len(messages)), 120, "taking in after the failover")

    sender.join(timeout=120)
    samples = wait_for_messages(service, len(messages), timeout=300)
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    eventually(service.ready, 60, "the service ready again")
    logs = service.logs()
    assert service.stop() == 0
    assert "retrying in" in logs  # it saw the master go
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
