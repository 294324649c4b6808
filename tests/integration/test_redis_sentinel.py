"""Redis with replicas: a commit that waits for its replica (`redis_wait_replicas`), and Redis Sentinel:
the service finds the master through the sentinels and, when the master dies and a replica is
promoted, finds the new one; its numbers still equal the replay."""

from __future__ import annotations

import gc
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stream_ndcg.devtools.redis_servers import RedisSentinels
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.engine import Engine
from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.metric import Measure
from stream_ndcg.state.redis import RedisStore
from tests.support.batches import apply_batch, parsed
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, progress, service_environment, wait_for_messages
from tests.support.topics import create_topic, send_paced
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinels]:
    group = RedisSentinels.start(tmp_path_factory.mktemp("redis-sentinel"))
    yield group
    group.stop()


def test_a_commit_waits_for_its_replica_and_one_it_did_not_confirm_is_an_outage(
        sentinels: RedisSentinels) -> None:
    store = RedisStore(redis.Redis.from_url(sentinels.master.url), namespace="wait", bucket_ms=60_000,
                       horizon_ms=3_600_000, state_ttl_ms=86_400_000, wall_clock=False, wait_replicas=1,
                       wait_timeout_ms=500)
    engine = Engine(Measure(cutoffs=(5,)), 60_000)
    events = parsed([value for _, value in simulated(100, seed=5, malformed=0.0)])
    epoch = store.claim("t:0")
    apply_batch(store, engine, "t:0", events[:50], epoch=epoch, next_offset=50)
    replica = redis.Redis.from_url(sentinels.replica.url)
    # Confirmed: the replica had it when the commit returned.
    assert replica.hget("{wait:t:0}:meta", "offset") == b"50"
    replica_pid = sentinels.replica.pid
    assert replica_pid is not None
    os.kill(replica_pid, signal.SIGSTOP)
    try:
        with pytest.raises(StoreUnavailable, match="confirmed by 0 of the 1 replicas"):
            apply_batch(store, engine, "t:0", events[50:], epoch=epoch, next_offset=100)
    finally:
        os.kill(replica_pid, signal.SIGCONT)
    # The master has it: the instance that claims again resumes after it, nothing counted twice.
    assert store.next_offset("t:0") == 100
    wait_until(lambda: replica.hget("{wait:t:0}:meta", "offset") == b"100", 30, "the replica caught up")
    replica.close()


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
    wait_until(lambda: progress(service) >= 1_500, 90, "the first 1,500 messages taken in")

    assert sentinels.master_port() == sentinels.master.port
    sentinels.master.kill()
    # What the test is about: the sentinels promoted the replica.
    wait_until(lambda: sentinels.master_port() == sentinels.replica.port, 60, "the replica promoted")
    before = progress(service)
    wait_until(lambda: progress(service) >= min(before + 500, len(messages)), 120, "taking in after the failover")

    sender.join(timeout=120)
    samples = wait_for_messages(service, len(messages), timeout=300)
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    wait_until(service.ready, 60, "the service ready again")
    logs = service.logs()
    assert service.stop() == 0
    assert "retrying in" in logs  # it saw the master go
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
