"""`stream-ndcg judge` against a real Kafka broker and a real Redis: simulated clicks (a
position-based model of hidden true grades) through `judge`, killed with -9 mid-stream, give the
judgments `replay --click-model` decides on the same events, and `run` reading them gives the
replay's nDCG, to 1e-9 (event clock); `judgments export` then writes what the judge published
last per pair, as JSON lines and as qrels that pytrec_eval reads, and `run`'s drill-down in the
judge's namespace shows the same grades and evidence."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytrec_eval
from kafka import KafkaConsumer

from stream_ndcg import wiring
from stream_ndcg.click_judge import ClickJudgment
from stream_ndcg.config import Settings
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay
from tests.support.service import Service, own_sample, service_environment, wait_for_messages
from tests.support.topics import create_topic, send_paced
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

CLICK_SETTINGS = {"click_min_impressions": "3", "judge_interval": "10m", "click_session": "2m",
                  "click_bucket": "10m", "click_horizon": "1h", "click_max_rank": "10"}


def clicks_in_time_order(events: int, seed: int) -> list[tuple[bytes, bytes]]:
    """Simulated searches and clicks, without the simulator's rater judgments (the judgments are the
    clicks'), in event-time order as a live stream brings them."""
    spec = SimulationSpec(events=events, seed=seed, queries=60, rate=0.5, clicks=True)
    messages = [(k, v) for k, v in Simulator(spec).messages() if b'"judgment"' not in v]
    return sorted(messages, key=lambda kv: orjson.loads(kv[1])["ts"])


def replay_with_clicks(messages: list[tuple[bytes, bytes]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    settings = Settings.load(flags=CLICK_SETTINGS)
    decided: list[ClickJudgment] = []
    replay = Replay(Measure(cutoffs=CUTOFFS), dedup_horizon_ms=settings.dedup_horizon,
                    click_judge=wiring.click_judge(settings), on_click_judgment=decided.append)
    for _, value in messages:
        replay.add(value)
    return replay.summary(), [j.message() for j in decided]


def published(bootstrap: str, topic: str, want: int, timeout: float = 120) -> tuple[list[dict[str, Any]], int]:
    """The judgments on the topic, deduplicated by event id and pair (as `run` counts them), once
    there are `want` of them; and how many judgment messages the topic holds in all. Each is on
    the partition of its query's impressions and clicks."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None,
                             enable_auto_commit=False)
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    partitions: dict[str, set[int]] = {}
    raw = 0
    try:
        def complete() -> bool:
            nonlocal raw
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    message = orjson.loads(record.value)
                    partitions.setdefault(message["query_id"], set()).add(record.partition)
                    if message["type"] != "judgment":
                        continue
                    raw += 1
                    assert record.key == message["query_id"].encode()
                    key = (message["event_id"], message["query_id"], message["doc_id"])
                    assert seen.setdefault(key, message) == message, "one event id published with two contents"
            return len(seen) >= want

        wait_until(complete, timeout, lambda: f"{want} judgments published ({len(seen)} so far)", interval=0.1)
    finally:
        consumer.close()
    assert all(len(found) == 1 for found in partitions.values()), "a judgment on another partition than its query"
    return sorted(seen.values(), key=lambda m: (m["ts"], m["query_id"], m["doc_id"])), raw


def export(env: dict[str, str], form: str) -> str:
    done = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "judgments", "export", "--format", form],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_exported(env: dict[str, str], published: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The export, with the judge's settings, is the last judgment published per pair, the
    retracted left out; the qrels hold the same grades as integers."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for message in published:  # in time order
        last[(message["query_id"], message["doc_id"])] = message
    current = [message for _, message in sorted(last.items()) if message["grade"] is not None]
    assert current and len(current) < len(last), "the stream should grade pairs and retract some"
    assert [orjson.loads(line) for line in export(env, "jsonl").splitlines()] == current
    qrels = pytrec_eval.parse_qrel(export(env, "qrels").splitlines())
    assert {(q.replace("%20", " "), d): r for q, docs in qrels.items() for d, r in docs.items()} == \
        {(m["query_id"], m["doc_id"]): int(m["grade"]) for m in current}
    return current


def test_judge_killed_mid_stream_and_run_on_its_judgments_equal_the_replay(
        kafka: KafkaBroker, redis_server: Any, services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=3)
    messages = clicks_in_time_order(4_000, seed=17)
    summary, decided = replay_with_clicks(messages)
    assert summary["click_judgments"]["boundaries"] >= 8 and len(decided) > 100
    env = service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                              STREAM_NDCG_JUDGE_GROUP_ID=f"judge-{uuid.uuid4().hex[:8]}", STREAM_NDCG_JUDGE_IDLE="1s",
                              STREAM_NDCG_BATCH_SIZE="100",
                              **{f"STREAM_NDCG_{name.upper()}": value for name, value in CLICK_SETTINGS.items()})
    judge = Service(env, tmp_path, command="judge")
    services.append(judge)
    judge.start()
    # Paced, so that the kill lands while judge works through the stream.
    sender = send_paced(kafka.bootstrap, topic, messages, 600.0)
    wait_until(lambda: own_sample(judge, "stream_ndcg_judgments_published_total") >= 20, 60,
               lambda: f"judge publishing\n{judge.logs()[-3000:]}", interval=0.05)
    judge.kill()
    judge.start()
    sender.join()
    wait_until(lambda: re.search(r"resuming at offset \d+", judge.logs()), 30,
               lambda: f"judge resuming mid-stream\n{judge.logs()[-3000:]}")
    got, raw = published(kafka.bootstrap, topic, len(decided))
    assert got == sorted(decided, key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))
    samples = judge.scrape()
    graded = {dict(labels)["grade"]: n for (name, labels), n in samples.items()
              if name == "stream_ndcg_judge_graded_pairs"}
    assert graded == summary["click_judgments"]["graded"]
    assert samples[("stream_ndcg_judge_events_total", (("type", "click"),))] == summary["click_judgments"][
        "events"]["click"]
    assert any(name == "stream_ndcg_judge_ctr" for name, _ in samples)
    assert judge.stop() == 0
    current = assert_exported(env, got)

    # run reads the same topic: the judgments are on their queries' partitions there. In the judge's
    # namespace, its drill-down shows the judge's grades and evidence.
    run = Service(service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                                      STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_K="5,10",
                                      STREAM_NDCG_NAMESPACE=env["STREAM_NDCG_NAMESPACE"]), tmp_path)
    services.append(run)
    run.start()
    samples = wait_for_messages(run, len(messages) + raw)
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    query_id = current[0]["query_id"]
    status, detail = run.api(f"/api/v1/queries/{query_id}?window=1d")
    assert status == 200 and detail["clicks"]["available"], detail
    shown = detail["clicks"]["documents"]
    assert {doc: (entry["grade"], entry["ts"], entry["evidence"]) for doc, entry in shown.items()} \
        == {m["doc_id"]: (m["grade"], m["ts"], m["evidence"]) for m in current if m["query_id"] == query_id}
    assert run.stop() == 0
