"""Chaos: faults while the stream is consumed, half of it written by a transactional producer with
aborted transactions between its commits; the end state must equal the uninterrupted computation
(the replay of the committed events) to 1e-9.

Two topologies, each with the faults it can suffer besides instances killed (-9), added and removed:
- one broker and one Redis: the broker restarted, Redis killed -9 (AOF everysec may roll it back
  up to a second);
- three KRaft nodes (replication 3, min.insync.replicas 2) and a Redis Cluster of three masters
  with a replica each: the leader of a partition killed -9, the active controller killed -9, the
  master of a partition's slot killed -9 and its replica promoted (each node started again after a
  random while, and back in sync before the next fault).

`make test` runs the short versions; `make chaos` the long ones (pytest -m slow).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import pytest

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisClusterNodes, RedisServer
from stream_ndcg.devtools.servers import KafkaBroker, KafkaCluster
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.failover import (
    active_controller,
    collect_refused_sockets,
    eventually,
    fully_replicated,
    leader_of,
    master_of,
)
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of
from tests.support.service import (
    Service,
    killed_at_exit,
    service_environment,
    settled,
    wait_for_messages,
    wait_for_partitions,
)
from tests.support.topics import create_topic, produce_in_transactions

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

INSTANCE_FAULTS = ("kill_instance", "add_instance", "remove_instance")
MOST_INSTANCES = 4
PARTITIONS = 6


def schedule(rnd: random.Random, rounds: int, instances: int, faults: tuple[str, ...]) -> list[str]:
    """One fault a round: every kind once in a random order, then kinds at random. An instance is added
    only while fewer than MOST_INSTANCES run, removed only while more than one does."""
    assert rounds >= len(faults), "too few rounds for every kind of fault"
    plan = list(faults)
    rnd.shuffle(plan)
    change = {"add_instance": 1, "remove_instance": -1}
    instances += sum(change.get(fault, 0) for fault in plan)
    while len(plan) < rounds:
        possible = [fault for fault in faults if (fault != "add_instance" or instances < MOST_INSTANCES)
                    and (fault != "remove_instance" or instances > 1)]
        plan.append(rnd.choice(possible))
        instances += change.get(plan[-1], 0)
    return plan


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Topology(Protocol):
    """The servers a chaos run uses, and the faults of theirs it inflicts."""

    faults: ClassVar[tuple[str, ...]]
    settings: ClassVar[dict[str, str]]

    @property
    def bootstrap(self) -> str: ...

    @property
    def redis_url(self) -> str: ...

    def inflict(self, fault: str, rnd: random.Random, topic: str, namespace: str) -> bool:
        """Cause `fault` and recover from it; whether it was seen to happen."""


@dataclass
class SingleNodes:
    """One broker and one Redis."""

    kafka: KafkaBroker
    redis: RedisServer
    faults: ClassVar[tuple[str, ...]] = ("restart_broker", "kill_redis")
    settings: ClassVar[dict[str, str]] = {}

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def inflict(self, fault: str, rnd: random.Random, topic: str, namespace: str) -> bool:
        if fault == "restart_broker":
            before = self.kafka.pid
            self.kafka.restart()
            return before is not None and self.kafka.pid != before and not os.path.exists(f"/proc/{before}")
        assert fault == "kill_redis"
        self.redis.kill()
        happened = not answers(self.redis.port)
        # How long Redis stays away is part of the chaos too.
        time.sleep(rnd.uniform(0.2, 1.5))
        self.redis.launch()
        return happened


@dataclass
class ReplicatedNodes:
    """Three KRaft nodes, and a Redis Cluster of three masters with a replica each."""

    kafka: KafkaCluster
    redis: RedisClusterNodes
    faults: ClassVar[tuple[str, ...]] = ("kill_leader", "kill_controller", "kill_redis_master")
    settings: ClassVar[dict[str, str]] = {"STREAM_NDCG_REDIS_CLUSTER": "true"}

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def redis_url(self) -> str:
        return next(node.url for node in self.redis.nodes if node.process is not None)

    def inflict(self, fault: str, rnd: random.Random, topic: str, namespace: str) -> bool:
        if fault == "kill_redis_master":
            key = f"{{{namespace}:{topic}:{rnd.randrange(PARTITIONS)}}}:meta"
            master = master_of(self.redis, key)
            master.kill()
            # It happened once the slot is served by another node: the replica was promoted.
            eventually(lambda: master_of(self.redis, key) is not master, 60, "a replica promoted")
            time.sleep(rnd.uniform(0.2, 1.5))
            master.launch()
            # Back as the new master's replica, in sync, before the next fault.
            master.wait_until_in_sync(timeout=120)
            self.redis.wait_until_healthy(timeout=120)
            return True
        if fault == "kill_leader":
            partition = rnd.randrange(PARTITIONS)
            node = leader_of(self.kafka, topic, partition)
            self.kafka.node(node).kill()
            eventually(lambda: leader_of(self.kafka, topic, partition) not in (node, -1), 60,
                       f"a new leader of partition {partition}")
        else:
            assert fault == "kill_controller"
            node = active_controller(self.kafka)
            self.kafka.node(node).kill()
            eventually(lambda: active_controller(self.kafka) not in (node, -1), 60, "a new active controller")
        time.sleep(rnd.uniform(0.2, 1.5))
        self.kafka.node(node).relaunch()
        # Every replica of every topic (offsets and transaction state included) in sync again, so that
        # the next kill leaves two in-sync replicas.
        eventually(lambda: fully_replicated(self.kafka), 180, "every replica back in sync")
        return True


@contextmanager
def single_nodes(workdir: Path) -> Iterator[SingleNodes]:
    with KafkaBroker.start(workdir / "kafka") as kafka, RedisServer.start(workdir / "redis") as redis_server:
        yield SingleNodes(kafka, redis_server)


@contextmanager
def replicated_nodes(workdir: Path) -> Iterator[ReplicatedNodes]:
    with KafkaCluster.start(workdir / "kafka", size=3) as kafka, \
            RedisClusterNodes.start(workdir / "redis", masters=3, replicas=1) as redis_cluster:
        yield ReplicatedNodes(kafka, redis_cluster)


def create_replicated_topic(topology: Topology) -> str:
    if isinstance(topology, ReplicatedNodes):
        topic = create_topic(topology.bootstrap, partitions=PARTITIONS, replication=3)
        eventually(lambda: fully_replicated(topology.kafka, [topic]), 60, "the topic's replicas in sync")
        return topic
    return create_topic(topology.bootstrap, partitions=PARTITIONS)


@pytest.fixture(autouse=True)
def refused_sockets_collected() -> Iterator[None]:
    yield
    collect_refused_sockets()


def chaos(topology: Topology, tmp_path: Path, events: int, rounds: int, seed: int) -> None:
    rnd = random.Random(seed)
    faults = INSTANCE_FAULTS + topology.faults
    topic = create_replicated_topic(topology)
    messages = list(Simulator(SimulationSpec(events=events, seed=seed, queries=2_000, rate=500.0,
                                             malformed_share=0.005, max_delay_ms=900_000)).messages())
    env = service_environment(topology.bootstrap, topology.redis_url, STREAM_NDCG_TOPICS=topic,
                              STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="300", **topology.settings)
    instances = [Service(env, tmp_path), Service(env, tmp_path)]
    ever = list(instances)
    for instance in instances:
        instance.start()
    plan = schedule(rnd, rounds, len(instances), faults)
    # Each fault is counted once it is seen to have happened (a process gone, a port refused, a leader
    # moved, partitions claimed), not once it was asked for.
    done: Counter[str] = Counter()
    chunks = [messages[i * len(messages) // rounds:(i + 1) * len(messages) // rounds] for i in range(rounds)]
    # What aborted transactions write: events of their own (other ids, other grades), never counted.
    junk = iter(Simulator(SimulationSpec(events=events // 4, seed=seed + 1_000, queries=2_000,
                                         rate=500.0)).messages())
    aborted = 0
    started = time.monotonic()
    with killed_at_exit(ever):
        for number, (chunk, fault) in enumerate(zip(chunks, plan, strict=True)):
            # Produced while every broker is up: every message is in Kafka exactly once, every other chunk
            # in transactions. The fault lands at a random moment of the consumption (the random wait is
            # the chaos, not a wait for a state).
            if number % 2:
                chunk_junk = [message for _, message in zip(range(len(chunk) // 4), junk, strict=False)]
                aborted += len(chunk_junk)
                producer = threading.Thread(target=produce_in_transactions,
                                            args=(topology.bootstrap, topic, chunk, chunk_junk))
            else:
                producer = threading.Thread(target=produce, args=(topology.bootstrap, topic, chunk))
            producer.start()
            time.sleep(rnd.uniform(0.5, 2.0))
            producer.join()
            happened = False
            if fault == "kill_instance":
                victim = rnd.choice(instances)
                assert victim.process is not None and victim.running()
                victim.kill()
                happened = victim.process.returncode == -signal.SIGKILL
                victim.start()
            elif fault == "add_instance":
                instances.append(Service(env, tmp_path))
                ever.append(instances[-1])
                instances[-1].start()
                # It takes part: the group gave it partitions and it claimed them.
                happened = wait_for_partitions(instances[-1], timeout=120) > 0
            elif fault == "remove_instance":
                removed = instances.pop(rnd.randrange(len(instances)))
                assert removed.stop() == 0
                happened = not removed.running()
            else:
                happened = topology.inflict(fault, rnd, topic, env["STREAM_NDCG_NAMESPACE"])
            if happened:
                done[fault] += 1
        # The situation the test is about: every fault planned happened, every kind at least once.
        assert aborted > 0, "no aborted transaction was written"
        planned = Counter(plan)
        assert done == planned and set(planned) == set(faults), \
            f"faults planned {dict(sorted(planned.items()))}, seen to happen {dict(sorted(done.items()))}"
        samples = wait_for_messages(instances[0], len(messages), timeout=900)
        summary = replay_of(messages)
        compared = expect_equal_to_replay(samples, summary, "1d", CUTOFFS)
        assert compared == compared_gauges()
        for instance in instances[1:]:
            # Every instance reports the same shared numbers.
            other = instance.scrape()
            assert settled(other) == len(messages)
            assert expect_equal_to_replay(other, summary, "1d", CUTOFFS) == compared
        starts = sum(i.starts for i in ever)
        kinds = ", ".join(f"{n} {fault}" for fault, n in sorted(done.items()))
        print(f"\nchaos ({type(topology).__name__}): {len(messages)} events ({aborted} more in aborted "
              f"transactions), {sum(done.values())} faults: {kinds}; {starts} service process starts; "
              f"{time.monotonic() - started:.0f} s; {compared} gauges of each of {len(instances)} instances "
              "equal to the replay to 1e-9")


def test_short_chaos(tmp_path: Path) -> None:
    with single_nodes(tmp_path) as topology:
        chaos(topology, tmp_path, events=30_000, rounds=6, seed=3)


@pytest.mark.slow
def test_short_replicated_chaos(tmp_path: Path) -> None:
    with replicated_nodes(tmp_path) as topology:
        chaos(topology, tmp_path, events=20_000, rounds=6, seed=5)


@pytest.mark.slow
def test_long_chaos(tmp_path: Path) -> None:
    with single_nodes(tmp_path) as topology:
        chaos(topology, tmp_path, events=200_000, rounds=24, seed=4)


@pytest.mark.slow
def test_long_replicated_chaos(tmp_path: Path) -> None:
    with replicated_nodes(tmp_path) as topology:
        chaos(topology, tmp_path, events=500_000, rounds=60, seed=6)
