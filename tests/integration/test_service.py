"""`stream-ndcg run` against a real Kafka broker and a real Redis: exact, late-aware, crash-proof."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ndcg.devtools.ports import free_port
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.events import encode
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import (
    Service,
    assigned_partitions,
    progress,
    records_committed,
    wait_for_messages,
    wait_for_partitions,
    wait_for_progress,
)
from tests.support.topics import create_topic, send_paced
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

def test_run_equals_replay_on_the_same_events(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=3)
    messages = simulated(8_000, seed=11)
    # The same impression delivered twice, as a retrying producer would.
    messages += messages[5:25]
    produce(kafka.bootstrap, topic, messages)
    service = Service(dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d"), tmp_path)
    services.append(service)
    service.start()
    samples = wait_for_messages(service, len(messages))
    summary = replay_of(messages)
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    events = summary["events"]
    assert isinstance(events, dict)
    assert samples[("stream_ndcg_events_total", (("type", "impression"),))] == events["impression"]
    assert samples[("stream_ndcg_events_total", (("type", "judgment"),))] == events["judgment"]
    for reason, count in events["rejected"].items():
        assert samples[("stream_ndcg_events_rejected_total", (("reason", reason),))] == count
    assert service.ready()
    assert service.stop() == 0


def test_a_late_judgment_moves_the_windows_that_hold_its_impressions(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap)
    t0 = 1_763_683_200_000
    hour = 3_600_000
    early = [encode({"type": "impression", "impression_id": f"early-{i}", "query_id": "q", "ts": t0 + i,
                      "results": ["a", "b", "c"], "segment": {"variant": "A"}}) for i in range(10)]
    judged = [encode({"type": "judgment", "query_id": "q", "doc_id": "b", "grade": 1, "ts": t0 + 1000})]
    service = Service(dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="5m,1h,24h"), tmp_path)
    services.append(service)
    service.start()
    produce(kafka.bootstrap, topic, [(b"q", m) for m in early + judged])
    before = wait_for_messages(service, 11)

    def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, window: str) -> float:
        return samples[(name, (("k", "5"), ("variant", "A"), ("window", window)))]

    # b at rank 2 is the only relevant document: nDCG@5 = (1/log2 3) / 1.
    assert value(before, "stream_ndcg_ndcg", "1d") == pytest.approx(0.6309297535714574, abs=1e-12)
    # An hour of event time later: a judgment for 'a', and impressions of the last minutes.
    late = [encode({"type": "judgment", "query_id": "q", "doc_id": "a", "grade": 3, "ts": t0 + hour})]
    recent = [encode({"type": "impression", "impression_id": f"recent-{i}", "query_id": "q",
                       "ts": t0 + hour - 60_000 + i, "results": ["c", "a"], "segment": {"variant": "A"}})
              for i in range(5)]
    produce(kafka.bootstrap, topic, [(b"q", m) for m in recent + late])
    after = wait_for_messages(service, 17)
    # 24h holds all 15 impressions: the early ones gain 'a' at rank 1.
    ideal = 7 + 1 / 1.5849625007211563
    early_ndcg = (7 + 1 / 1.5849625007211563) / ideal
    recent_ndcg = (7 / 1.5849625007211563) / ideal
    assert value(after, "stream_ndcg_ndcg", "1d") == pytest.approx((10 * early_ndcg + 5 * recent_ndcg) / 15,
                                                                     abs=1e-9)
    assert value(after, "stream_ndcg_scored_impressions", "1d") == 15
    # 5m holds only the recent impressions: the early ones are an hour old by the event clock.
    assert value(after, "stream_ndcg_scored_impressions", "5m") == 5
    assert value(after, "stream_ndcg_ndcg", "5m") == pytest.approx(recent_ndcg, abs=1e-9)
    # The exact 1h window ends at the judgment's time; the early impressions fall out of it.
    assert value(after, "stream_ndcg_scored_impressions", "1h") == 5
    # Each batch asked the state cache for q's state (found there, or read back from Redis), and it holds it.
    assert sum(after[("stream_ndcg_state_cache_lookups_total", (("result", result),))]
               for result in ("hit", "miss")) >= 2
    # Only a claim (a rebalance, a recovery) empties it: the log says when one came.
    assert after[("stream_ndcg_state_cache_states", ())] == 1, service.logs()[-5000:]
    assert service.stop() == 0


def test_kill_9_at_random_moments_loses_and_doubles_nothing(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(30_000, seed=21)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="200")
    service = Service(env, tmp_path)
    services.append(service)
    rnd = random.Random(5)
    kills = 0
    service.start()
    # Paced over ~12 s, so that the kills land mid-stream however fast the service catches up.
    sender = send_paced(kafka.bootstrap, topic, messages, 2_500.0)
    while kills < 6:
        # A random point of the stream, not a random time: each kill lands while the service works, after
        # it has taken in more since its last start (a time could fall while it is still joining the group).
        if wait_for_progress(service, min(progress(service) + rnd.randint(500, 3_000), len(messages))) \
                >= len(messages):
            break
        service.kill()
        kills += 1
        service.start()
    sender.join()
    samples = wait_for_messages(service, len(messages), timeout=300)
    print(f"crash test: {kills} kill -9, {len(messages)} events")
    assert kills >= 3, "the stream ended before the service could be killed three times"
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert service.stop() == 0


def test_two_instances_one_stopped_midway_equal_one(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=4)
    messages = simulated(20_000, seed=31)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="100")
    first, second = Service(env, tmp_path), Service(env, tmp_path)
    services.extend([first, second])
    first.start()
    second.start()
    # The situation the test is about: the second instance holds partitions of its own and has committed
    # records of them when it stops, so that the first takes over a partition another instance wrote.
    wait_for_partitions(second)
    produce(kafka.bootstrap, topic, messages[: len(messages) // 2])
    wait_until(lambda: records_committed(second) > 0, 60,
               lambda: f"records committed by the second instance\n{second.logs()[-3000:]}")
    assert f"claimed {topic}:" in second.logs()
    assert second.stop() == 0
    produce(kafka.bootstrap, topic, messages[len(messages) // 2:])
    samples = wait_for_messages(first, len(messages))
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert assigned_partitions(first) == 4
    assert first.stop() == 0


def test_redis_restarted_mid_stream_recovers_by_itself(
        kafka: KafkaBroker, redis_server: RedisServer, service_env: dict[str, str], services: list[Service],
        tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(20_000, seed=41)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="200")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    # Paced over ~8 s, so that Redis goes away mid-stream: once the service has taken in part of the
    # stream, while the rest is still arriving.
    sender = send_paced(kafka.bootstrap, topic, messages, 2_500.0)
    wait_for_progress(service, 1, 60)
    assert sender.is_alive(), "the whole stream was sent before Redis could go away mid-stream"
    redis_server.stop()
    wait_until(lambda: not service.ready(), 30, "the service saying not ready while Redis is down")
    redis_server.launch()
    sender.join()
    samples = wait_for_messages(service, len(messages), timeout=300)
    assert expect_equal_to_replay(samples, replay_of(messages), "1d", CUTOFFS) == compared_gauges()
    assert service.ready()
    assert "retrying" in service.logs()
    assert service.stop() == 0


def test_three_instances_over_twelve_partitions_report_what_one_instance_reports(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=12)
    messages = simulated(24_000, seed=61)
    base = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1h,1d", STREAM_NDCG_BATCH_SIZE="100")
    # The same topic read twice: by one instance, and by a group of three whose partitions move.
    alone = Service(dict(base, STREAM_NDCG_GROUP_ID=base["STREAM_NDCG_GROUP_ID"] + "-alone",
                         STREAM_NDCG_NAMESPACE=base["STREAM_NDCG_NAMESPACE"] + "-alone"), tmp_path)
    group = [Service(base, tmp_path) for _ in range(3)]
    services.extend([alone, *group])
    alone.start()
    group[0].start()
    sender = send_paced(kafka.bootstrap, topic, messages, 4_000.0)
    # The partitions move while the stream arrives: the first of the group commits records of its own,
    # the second and third join and each takes partitions from those before it, then the first stops.
    wait_until(lambda: records_committed(group[0]) > 0, 60,
               lambda: f"records committed by the first of the group\n{group[0].logs()[-3000:]}")
    for joining in group[1:]:
        joining.start()
        wait_for_partitions(joining)
    assert group[0].stop() == 0
    sender.join()
    single = wait_for_messages(alone, len(messages))
    for service in group[1:]:
        together = wait_for_messages(service, len(messages))
        compared = 0
        for (name, labels), value in single.items():
            if name.startswith(("stream_ndcg_ndcg", "stream_ndcg_dcg", "stream_ndcg_judged_ratio",
                                "stream_ndcg_scored_impressions", "stream_ndcg_impressions", "stream_ndcg_events")):
                assert together[(name, labels)] == pytest.approx(value, abs=1e-9, nan_ok=True), (name, labels)
                compared += 1
        assert compared > 50
    summary = replay_of(messages)
    assert expect_equal_to_replay(single, summary, "1d", CUTOFFS) == compared_gauges()
    for service in (alone, *group[1:]):
        assert service.stop() == 0


def test_a_changed_metric_configuration_is_refused_until_a_rebuild_recomputes_from_the_beginning(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    messages = simulated(6_000, seed=81)
    produce(kafka.bootstrap, topic, messages)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d")
    first = Service(env, tmp_path)
    services.append(first)
    first.start()
    wait_for_messages(first, len(messages))
    assert first.stop() == 0

    changed = dict(env, STREAM_NDCG_K="5,10,20")
    refused = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "run"],
                             env=dict(os.environ, **changed, STREAM_NDCG_METRICS_PORT=str(free_port())),
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "k: 20 is deeper than the 10 ranks the state keeps" in refused.stderr
    assert "rebuild" in refused.stderr

    rebuilt = Service(dict(changed, STREAM_NDCG_REBUILD="true"), tmp_path)
    services.append(rebuilt)
    rebuilt.start()
    samples = wait_for_messages(rebuilt, len(messages))
    cutoffs = (5, 10, 20)
    assert expect_equal_to_replay(samples, replay_of(messages, cutoffs), "1d", cutoffs) == compared_gauges(cutoffs)
    assert "state rebuilt for a new metric configuration" in rebuilt.logs()
    assert rebuilt.stop() == 0
