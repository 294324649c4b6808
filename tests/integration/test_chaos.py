"""Chaos: kill -9 instances, restart the broker, kill -9 Redis (AOF everysec may roll it back up to
a second), add and remove instances, all while the stream is consumed, half of it written by a
transactional producer with aborted transactions between its commits; the end state must equal
the uninterrupted computation (the replay of the committed events) to 1e-9.

`make test` runs the short version; `make chaos` the long one (pytest -m slow).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
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

FAULTS = ("kill_instance", "add_instance", "remove_instance", "restart_broker", "kill_redis")
MOST_INSTANCES = 4


def schedule(rnd: random.Random, rounds: int, instances: int) -> list[str]:
    """One fault a round: every kind once in a random order, then kinds at random. An instance is added
    only while fewer than MOST_INSTANCES run, removed only while more than one does."""
    assert rounds >= len(FAULTS), "too few rounds for every kind of fault"
    plan = list(FAULTS)
    rnd.shuffle(plan)
    change = {"add_instance": 1, "remove_instance": -1}
    instances += sum(change.get(fault, 0) for fault in plan)
    while len(plan) < rounds:
        possible = [fault for fault in FAULTS if (fault != "add_instance" or instances < MOST_INSTANCES)
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


def chaos(tmp_path: Path, events: int, rounds: int, seed: int) -> None:
    rnd = random.Random(seed)
    with KafkaBroker.start(tmp_path / "kafka") as kafka, RedisServer.start(tmp_path / "redis") as redis_server:
        topic = create_topic(kafka.bootstrap, partitions=6)
        messages = list(Simulator(SimulationSpec(events=events, seed=seed, queries=2_000, rate=500.0,
                                                 malformed_share=0.005, max_delay_ms=900_000)).messages())
        env = service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                                  STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="300")
        instances = [Service(env, tmp_path), Service(env, tmp_path)]
        ever = list(instances)
        for instance in instances:
            instance.start()
        plan = schedule(rnd, rounds, len(instances))
        # Each fault is counted once it is seen to have happened (a process gone, a port refused, partitions
        # claimed), not once it was asked for.
        done: Counter[str] = Counter()
        chunks = [messages[i * len(messages) // rounds:(i + 1) * len(messages) // rounds] for i in range(rounds)]
        # What aborted transactions write: events of their own (other ids, other grades), never counted.
        junk = iter(Simulator(SimulationSpec(events=events // 4, seed=seed + 1_000, queries=2_000,
                                             rate=500.0)).messages())
        aborted = 0
        with killed_at_exit(ever):
            for number, (chunk, fault) in enumerate(zip(chunks, plan, strict=True)):
                # Produced while the broker is up: every message is in Kafka exactly once, every other chunk
                # in transactions. The fault lands at a random moment of the consumption (the random wait is
                # the chaos, not a wait for a state).
                if number % 2:
                    chunk_junk = [message for _, message in zip(range(len(chunk) // 4), junk, strict=False)]
                    aborted += len(chunk_junk)
                    producer = threading.Thread(target=produce_in_transactions,
                                                args=(kafka.bootstrap, topic, chunk, chunk_junk))
                else:
                    producer = threading.Thread(target=produce, args=(kafka.bootstrap, topic, chunk))
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
                elif fault == "restart_broker":
                    before = kafka.pid
                    kafka.restart()
                    happened = before is not None and kafka.pid != before and not os.path.exists(f"/proc/{before}")
                elif fault == "kill_redis":
                    redis_server.kill()
                    happened = not answers(redis_server.port)
                    # How long Redis stays away is part of the chaos too.
                    time.sleep(rnd.uniform(0.2, 1.5))
                    redis_server.launch()
                if happened:
                    done[fault] += 1
            # The situation the test is about: every fault planned happened, every kind at least once.
            assert aborted > 0, "no aborted transaction was written"
            planned = Counter(plan)
            assert done == planned and set(planned) == set(FAULTS), \
                f"faults planned {dict(sorted(planned.items()))}, seen to happen {dict(sorted(done.items()))}"
            samples = wait_for_messages(instances[0], len(messages), timeout=600)
            summary = replay_of(messages)
            compared = expect_equal_to_replay(samples, summary, "1d", CUTOFFS)
            assert compared == compared_gauges()
            for instance in instances[1:]:
                # Every instance reports the same shared numbers.
                other = instance.scrape()
                assert settled(other) == len(messages)
                assert expect_equal_to_replay(other, summary, "1d", CUTOFFS) == compared
            starts = sum(i.starts for i in ever)
            print(f"\nchaos: {len(messages)} events ({aborted} more in aborted transactions), "
                  f"{done['kill_instance']} kill -9 of an instance, "
                  f"{done['restart_broker']} broker restarts, {done['kill_redis']} Redis kill -9, "
                  f"{done['add_instance']} instances added, {done['remove_instance']} removed, "
                  f"{starts} service process starts; {compared} gauges of each of {len(instances)} instances "
                  "equal to the replay to 1e-9")


def test_short_chaos(tmp_path: Path) -> None:
    chaos(tmp_path, events=30_000, rounds=6, seed=3)


@pytest.mark.slow
def test_long_chaos(tmp_path: Path) -> None:
    chaos(tmp_path, events=200_000, rounds=24, seed=4)
