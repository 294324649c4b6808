"""Chaos: kill -9 instances, restart the broker, kill -9 Redis (AOF everysec may roll it back up to
a second), add and remove instances, all while the stream is consumed; the end state must equal
the uninterrupted computation (the replay of the same events) to 1e-9.

`make test` runs the short version; `make chaos` the long one (pytest -m slow).
"""

from __future__ import annotations

import random
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
from tests.support.service import Service, killed_at_exit, service_environment, settled, wait_for_messages
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

FAULTS = ("kill_instance", "add_instance", "remove_instance", "restart_broker", "kill_redis")


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
        done: Counter[str] = Counter()
        chunks = [messages[i * len(messages) // rounds:(i + 1) * len(messages) // rounds] for i in range(rounds)]
        with killed_at_exit(ever):
            for chunk in chunks:
                # Produced while the broker is up: every message is in Kafka exactly once.
                producer = threading.Thread(target=produce, args=(kafka.bootstrap, topic, chunk))
                producer.start()
                time.sleep(rnd.uniform(0.5, 2.0))
                producer.join()
                fault = rnd.choice(FAULTS)
                if fault == "kill_instance":
                    victim = rnd.choice(instances)
                    victim.kill()
                    victim.start()
                elif fault == "add_instance" and len(instances) < 4:
                    instances.append(Service(env, tmp_path))
                    ever.append(instances[-1])
                    instances[-1].start()
                elif fault == "remove_instance" and len(instances) > 1:
                    assert instances.pop(rnd.randrange(len(instances))).stop() == 0
                elif fault == "restart_broker":
                    kafka.restart()
                elif fault == "kill_redis":
                    redis_server.kill()
                    time.sleep(rnd.uniform(0.2, 1.5))
                    redis_server.launch()
                else:
                    continue
                done[fault] += 1
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
            print(f"\nchaos: {len(messages)} events, {done['kill_instance']} kill -9 of an instance, "
                  f"{done['restart_broker']} broker restarts, {done['kill_redis']} Redis kill -9, "
                  f"{done['add_instance']} instances added, {done['remove_instance']} removed, "
                  f"{starts} service process starts; {compared} gauges of each of {len(instances)} instances "
                  "equal to the replay to 1e-9")
            assert sum(done.values()) >= rounds // 2


def test_short_chaos(tmp_path: Path) -> None:
    chaos(tmp_path, events=30_000, rounds=6, seed=3)


@pytest.mark.slow
def test_long_chaos(tmp_path: Path) -> None:
    chaos(tmp_path, events=200_000, rounds=24, seed=4)
