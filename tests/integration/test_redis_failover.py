"""A Redis Cluster master killed mid-stream, its replica promoted: the service resumes from what the
new master holds, and its numbers still equal the replay.

Replication is asynchronous: the master may have acknowledged a commit its replica never got. The
partition's state and offset live in one slot, so the promoted replica holds an older state and the
offset of that same older state; the next commit expects the offset this instance wrote, is refused,
and the instance claims again and reads Kafka from what Redis holds. See docs/reliability.md for
what a lost acknowledged write can still do to keys outside a partition's slot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_ndcg.devtools.redis_servers import RedisClusterNodes
from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.failover import collect_refused_sockets, eventually, master_of
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, progress, service_environment, wait_for_messages
from tests.support.topics import create_topic, send_paced

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def replicated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    cluster = RedisClusterNodes.start(tmp_path_factory.mktemp("redis-replicated"), masters=3, replicas=1)
    yield cluster
    cluster.stop()


def test_a_master_killed_mid_stream_and_its_replica_promoted_changes_no_number(
        kafka: KafkaBroker, replicated_cluster: RedisClusterNodes, services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(6_000, seed=41)
    env = service_environment(kafka.bootstrap, replicated_cluster.url, STREAM_NDCG_TOPICS=topic,
                              STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_REDIS_CLUSTER="true")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    sender = send_paced(kafka.bootstrap, topic, messages, rate=200.0)
    eventually(lambda: progress(service) >= 1_500, 90, "the first 1,500 messages taken in")

    key = f"{{{env['STREAM_NDCG_NAMESPACE']}:{topic}:0}}:meta"
    master = master_of(replicated_cluster, key)
    master.kill()
    # What the test is about: the partition's slot is served by another node, the promoted replica.
    eventually(lambda: master_of(replicated_cluster, key) is not master, 60, "a replica promoted")
    before = progress(service)
    eventually(lambda: progress(service) >= min(before + 500, len(messages)), 120, "taking in after the failover")

    sender.join(timeout=120)
    samples = wait_for_messages(service, len(messages), timeout=300)
    summary = replay_of(messages)
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    eventually(service.ready, 60, "the service ready again")
    logs = service.logs()
    assert service.stop() == 0
    # The service saw the master go (and, if the replica lacked a write it had acknowledged, the
    # refused commit that made it claim again: "not at the expected offset").
    assert "retrying in" in logs
    print("commits refused after the failover:", logs.count("not at the expected offset"))
    collect_refused_sockets()
