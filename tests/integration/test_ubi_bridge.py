"""`stream-ndcg ubi-bridge` on the real broker: UBI 1.3.0 documents (tests/fixtures/ubi, valid by the
published schemas) give the impressions and clicks of the same searches written in the contract, a
kill -9 repeats only events with the same ids, and the click judgments of both are the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.request import urlopen

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2
from prometheus_client.parser import text_string_to_metric_families

from stream_ndcg.cli import main
from stream_ndcg.devtools.ports import free_port
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.ubi import contract_message
from tests.support.topics import create_topic
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ubi"
PARTITIONS = 2


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def keyed(name: str) -> list[tuple[bytes | None, bytes | None]]:
    """The UBI documents keyed by UBI query_id, as a UBI pipeline to Kafka is set to key them."""
    return [(json.loads(line)["query_id"].encode() if "query_id" in json.loads(line) else None, line.encode())
            for line in lines(name)]


def closing(partitions: int) -> tuple[list[tuple[bytes | None, bytes | None]], list[tuple[bytes | None, bytes | None]],
                                      list[Impression]]:
    """A search with no hits and a view on it, half an hour on, in each partition (keys found with
    the producers' partitioner): a partition's clock moves with its own documents only, and these
    move every one past the fixtures' waits. Returns the searches, the views, and their impressions."""
    searches: list[tuple[bytes | None, bytes | None]] = []
    views: list[tuple[bytes | None, bytes | None]] = []
    impressions: list[Impression] = []
    for partition in range(partitions):
        qid = next(f"closing-{n}" for n in range(100)
                   if (murmur2(f"closing-{n}".encode()) & 0x7FFFFFFF) % partitions == partition)
        searches.append((qid.encode(), json.dumps({"query_id": qid, "user_query": "closing", "timestamp":
                                                  "2025-03-01T10:40:00Z", "query_response_hit_ids": []}).encode()))
        views.append((qid.encode(), json.dumps({"action_name": "view", "query_id": qid,
                                               "timestamp": "2025-03-01T10:40:00Z"}).encode()))
        impressions.append(Impression(qid, "closing", 1_740_825_600_000, (), (), None))
    return searches, views, impressions


def start_bridge(env: dict[str, str], workdir: Path, run: int) -> subprocess.Popen[bytes]:
    with open(workdir / f"bridge-{run}.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "stream_ndcg.cli", "ubi-bridge"], env={**os.environ, **env},
                                stdout=log, stderr=subprocess.STDOUT)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()  # noqa: S310
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def read_all(bootstrap: str, topic: str, expected: int, timeout: float = 90) -> list[tuple[bytes, bytes]]:
    """Every message of `topic` once at least `expected` have come (and a quiet second after)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             isolation_level="read_committed", group_id=f"reader-{uuid.uuid4().hex[:8]}")
    got: list[tuple[bytes, bytes]] = []
    try:
        def enough() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((record.key, record.value) for record in records)
            return len(got) >= expected

        wait_until(enough, timeout, lambda: f"{expected} messages on {topic}, got {len(got)}")
        for records in consumer.poll(timeout_ms=1000).values():
            got.extend((record.key, record.value) for record in records)
    finally:
        consumer.close()
    return got


def without_ids(events: list[Impression | Click]) -> list[Impression | Click]:
    return sorted({event._replace(event_id=None) for event in events}, key=repr)


def replayed_judgments(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], object]:
    """The COEC judgments (and the nDCG) that `replay --click-model` derives from a file of the contract."""
    out = tmp_path / f"{path.stem}.judgments.jsonl"
    capsys.readouterr()
    assert main(["replay", str(path), "--click-model", "coec", "--click-min-impressions", "1", "--click-session",
                 "1m", "--judge-interval", "1m", "--judgments-out", str(out)]) == 0
    return out.read_text().splitlines(), json.loads(capsys.readouterr().out)["k"]


def in_time_order(events: list[bytes], path: Path) -> Path:
    """The events one a line, by time (impressions before clicks at the same time): the order a producer
    of the contract would write them in."""
    parsed = [(parse_event(value), value) for value in events]
    ordered = sorted(parsed, key=lambda pair: (pair[0].ts, isinstance(pair[0], Click)))  # type: ignore[union-attr]
    path.write_bytes(b"".join(value + b"\n" for _, value in ordered))
    return path


def test_ubi_documents_through_the_bridge_are_the_contract_s_events(
        kafka: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queries, events, output = (create_topic(kafka.bootstrap, PARTITIONS) for _ in range(3))
    searches, views, closing_impressions = closing(PARTITIONS)
    produce(kafka.bootstrap, queries, keyed("queries.jsonl") + searches)
    produce(kafka.bootstrap, events, keyed("events.jsonl") + views)
    port = free_port()
    env = {"STREAM_NDCG_BOOTSTRAP_SERVERS": kafka.bootstrap, "STREAM_NDCG_UBI_QUERIES_TOPIC": queries,
           "STREAM_NDCG_UBI_EVENTS_TOPIC": events, "STREAM_NDCG_UBI_OUTPUT_TOPIC": output,
           "STREAM_NDCG_UBI_GROUP_ID": f"bridge-{uuid.uuid4().hex[:8]}", "STREAM_NDCG_LINGER": "50ms",
           "STREAM_NDCG_UBI_EXCLUDED_CLIENTS": "*-bot", "STREAM_NDCG_METRICS_PORT": str(port)}
    contract = [parse_event(line) for line in lines("contract.jsonl")] + closing_impressions
    bridge = start_bridge(env, tmp_path, 0)
    try:
        written = read_all(kafka.bootstrap, output, len(contract))
        got = [parse_event(value) for _, value in written]
        assert without_ids(got) == without_ids(contract), (  # type: ignore[arg-type]
            set(without_ids(got)) ^ set(without_ids(contract)))  # type: ignore[arg-type]
        assert all(key == json.loads(value)["query_id"].encode() for key, value in written)
        # Counted as read: a rebalance as the group forms reads a partition again, and counts it again.
        joined = ("stream_ndcg_ubi_clicks_total", (("outcome", "joined"),))
        samples = wait_until(lambda: (found := scrape(port)).get(joined, 0) >= 5 and found or None, 30,
                             "the joined clicks counted", ignoring=(OSError,))
        assert samples[("stream_ndcg_ubi_impressions_total", ())] >= len(contract) - 5
        assert samples[("stream_ndcg_ubi_documents_total", (("kind", "query"),))] >= len(lines("queries.jsonl")) + 2
        for reason, least in (("excluded_client", 2), ("other_action", 3 + 2), ("missing_object", 1)):
            assert samples[("stream_ndcg_ubi_skipped_total", (("reason", reason),))] >= least

        # Killed mid-stream: what the lanes held is read again, and only the same events are written again.
        bridge.send_signal(signal.SIGKILL)
        bridge.wait(timeout=30)
        bridge = start_bridge(env, tmp_path, 1)
        wait_until(lambda: scrape(port)[("stream_ndcg_ubi_documents_total", (("kind", "query"),))] > 0, 60,
                   "the restarted bridge reading again", ignoring=(OSError,))
        again = read_all(kafka.bootstrap, output, len(written) + 1)
        assert {value for _, value in again} == {value for _, value in written}
    finally:
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(timeout=30) == 0

    # The judgments from clicks (and the nDCG scored with them) of both, duplicates and all, are the same.
    from_ubi = replayed_judgments(in_time_order([value for _, value in again], tmp_path / "ubi.jsonl"), tmp_path,
                                  capsys)
    direct = in_time_order([line.encode() for line in lines("contract.jsonl")]
                           + [contract_message(impression)[1] for impression in closing_impressions],
                           tmp_path / "direct.jsonl")
    from_contract = replayed_judgments(direct, tmp_path, capsys)
    assert from_ubi[0], "the replay decided no judgment"
    assert from_ubi == from_contract


def committed(bootstrap: str, group: str, topic: str) -> int | None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({group: [TopicPartition(topic, 0)]}).get(group, {}).get(
            TopicPartition(topic, 0))
    finally:
        admin.close()
    return None if found is None else found.offset


def test_an_impression_too_large_for_the_output_topic_is_counted_and_the_bridge_goes_on(
        kafka: KafkaBroker, tmp_path: Path) -> None:
    queries, events = (create_topic(kafka.bootstrap) for _ in range(2))
    # Larger than the small impressions, in batches kafka-python splits, smaller than the large one.
    output = create_topic(kafka.bootstrap, configs={"max.message.bytes": "4096"})
    large = 2

    def search(n: int) -> tuple[bytes, bytes]:
        hits = [f"doc-{i:05d}-{'x' * 40}" for i in range(200)] if n == large else [f"d{n}-{i}" for i in range(3)]
        return f"q-{n}".encode(), json.dumps({"query_id": f"q-{n}", "user_query": "tv", "query_response_hit_ids": hits,
                                             "timestamp": f"2025-03-01T10:00:{n:02d}Z"}).encode()

    searches, views, closing_impressions = closing(1)
    documents = [search(n) for n in range(6)]
    assert len(documents[large][1]) > 4096 > max(len(value) for n, (_, value) in enumerate(documents) if n != large)
    produce(kafka.bootstrap, queries, documents + searches)
    produce(kafka.bootstrap, events, views)
    group, port = f"bridge-{uuid.uuid4().hex[:8]}", free_port()
    env = {"STREAM_NDCG_BOOTSTRAP_SERVERS": kafka.bootstrap, "STREAM_NDCG_UBI_QUERIES_TOPIC": queries,
           "STREAM_NDCG_UBI_EVENTS_TOPIC": events, "STREAM_NDCG_UBI_OUTPUT_TOPIC": output,
           "STREAM_NDCG_UBI_GROUP_ID": group, "STREAM_NDCG_LINGER": "50ms", "STREAM_NDCG_METRICS_PORT": str(port)}
    bridge = start_bridge(env, tmp_path, 0)
    try:
        # A rebalance as the group forms may write some again (the same events).
        written = read_all(kafka.bootstrap, output, 6)
        assert {json.loads(value)["impression_id"] for _, value in written} == {
            *(f"q-{n}" for n in range(6) if n != large), *(i.impression_id for i in closing_impressions)}
        too_large = ("stream_ndcg_ubi_skipped_total", (("reason", "too_large"),))
        samples = wait_until(lambda: (found := scrape(port)).get(too_large, 0) >= 1 and found or None, 30,
                             "the impression too large counted", ignoring=(OSError,))
        # Committed past it: the searches before the closing one are forgotten, the closing one is held.
        wait_until(lambda: committed(kafka.bootstrap, group, queries) == len(documents), 60,
                   "the queries committed past the impression too large")
        assert samples[("stream_ndcg_ready", ())] == 1
        assert not [key for key, value in scrape(port).items() if key[0] == "stream_ndcg_backoffs_total" and value]
    finally:
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(timeout=30) == 0
    log = (tmp_path / "bridge-0.log").read_text()
    assert "the impression of UBI query_id 'q-2'" in log and "doc-00000" not in log
