"""The ubi-bridge's loop (`stream_ndcg.ubi_bridge`) on the in-memory source: lanes, commits of what
is still held, restarts and rebalances that repeat events only with the same ids."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.source.base import Partition
from stream_ndcg.source.local import LocalSource
from stream_ndcg.ubi import UbiCounts, UbiOptions, contract_message
from stream_ndcg.ubi_bridge import BridgeMetrics, BridgeOptions, UbiBridge
from tests.unit.test_ubi import OPTIONS, fixture_run, lines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ubi"
QUERIES, EVENTS = "ubi_queries", "ubi_events"


class ListSink:
    """Keeps what it is sent; refuses values over `max_size` bytes as the output topic would: at the
    flush (as the broker does) if `refuse_at_flush`, else at once (as the producer does)."""

    def __init__(self, max_size: int = 1 << 20, refuse_at_flush: bool = False) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.flushed = 0
        self.fail = False
        self.max_size = max_size
        self.refuse_at_flush = refuse_at_flush
        self._refused: list[Callable[[], None]] = []

    def send(self, key: bytes, value: bytes, on_too_large: Callable[[], None]) -> None:
        if len(value) <= self.max_size:
            self.sent.append((key, value))
        elif self.refuse_at_flush:
            self._refused.append(on_too_large)
        else:
            on_too_large()

    def flush(self) -> None:
        if self.fail:
            raise BrokerUnavailable("output topic down")
        for refused in self._refused:
            refused()
        self._refused.clear()
        self.flushed = len(self.sent)

    def events(self) -> list[Impression | Click]:
        return [parse_event(value) for _, value in self.sent[:self.flushed]]  # type: ignore[misc]


def loaded(partitions: int) -> LocalSource:
    """The fixtures in UBI topics of `partitions` partitions each, keyed (and so partitioned) by UBI query_id."""
    source = LocalSource({QUERIES: partitions, EVENTS: partitions})
    for topic, name in ((QUERIES, "queries.jsonl"), (EVENTS, "events.jsonl")):
        for line in lines(name):
            key = json.loads(line).get("query_id", "").encode()
            source.append(topic, zlib.crc32(key) % partitions, key=key or None, value=line.encode())
    return source


def bridge_of(source: LocalSource, sink: ListSink, options: UbiOptions = OPTIONS) -> tuple[UbiBridge, UbiCounts]:
    counts = UbiCounts()
    return UbiBridge(source, sink, BridgeOptions(QUERIES, EVENTS, 0, 4, "earliest", options),
                     BridgeMetrics(CollectorRegistry(), counts)), counts


def drain(bridge: UbiBridge, polls: int = 12) -> None:
    for _ in range(polls):
        bridge.run_once()


def test_one_lane_gives_what_the_join_gives_and_commits_what_it_still_holds() -> None:
    source, sink = loaded(1), ListSink()
    bridge, counts = bridge_of(source, sink)
    drain(bridge)
    join, expected = fixture_run()
    assert sorted(sink.events(), key=repr) == sorted(expected, key=repr)
    assert counts == join.counts
    for key, value in sink.sent:
        assert key == json.loads(value)["query_id"].encode()
    # Nothing is held once the last event moved the clock on, except the searches clicks may still come for.
    assert source.committed == {Partition(QUERIES, 0): 0, Partition(EVENTS, 0): len(lines("events.jsonl"))}
    assert bridge.ready()


def test_a_restart_reads_again_what_was_held_and_repeats_only_the_same_events() -> None:
    source, sink = loaded(2), ListSink()
    bridge, _ = bridge_of(source, sink)
    drain(bridge)
    first = sink.events()
    assert sorted(first, key=repr) == sorted(fixture_run()[1], key=repr)
    bridge._close()
    again = ListSink()
    restarted, _ = bridge_of(source, again)
    drain(restarted)
    assert again.events() and set(again.events()) <= set(first)


def test_a_rebalance_drops_the_lanes_taken_away_and_a_failed_flush_commits_nothing() -> None:
    source, sink = loaded(2), ListSink()
    bridge, _ = bridge_of(source, sink)
    bridge.run_once()
    source.assign({Partition(QUERIES, 1), Partition(EVENTS, 1)})
    drain(bridge)
    assert set(bridge._lanes) == {1}
    committed = dict(source.committed)
    source.assign({Partition(t, n) for t in (QUERIES, EVENTS) for n in (0, 1)})
    sink.fail = True
    try:
        bridge.run_once()
        raise AssertionError("the flush failed")
    except BrokerUnavailable:
        pass
    assert source.committed == committed
    bridge._close()
    sink.fail = False
    drain(bridge)
    assert set(sink.events()) == set(fixture_run()[1])


@pytest.mark.parametrize("refuse_at_flush", [False, True])
def test_an_event_too_large_for_the_output_is_counted_skipped_and_committed_past(
        refuse_at_flush: bool, caplog: pytest.LogCaptureFixture) -> None:
    expected = fixture_run()[1]
    largest = max(expected, key=lambda event: len(contract_message(event)[1]))
    size = len(contract_message(largest)[1])
    assert isinstance(largest, Impression) and sum(len(contract_message(e)[1]) == size for e in expected) == 1
    source, sink = loaded(1), ListSink(max_size=size - 1, refuse_at_flush=refuse_at_flush)
    bridge, counts = bridge_of(source, sink)
    with caplog.at_level(logging.WARNING, "stream_ndcg.ubi_bridge"):
        drain(bridge)
    assert sorted(sink.events(), key=repr) == sorted(set(expected) - {largest}, key=repr)
    assert counts.skipped["too_large"] == 1
    assert source.committed == {Partition(QUERIES, 0): 0, Partition(EVENTS, 0): len(lines("events.jsonl"))}
    [logged] = [r.getMessage() for r in caplog.records if "too large" in r.getMessage()]
    key, value = contract_message(largest)
    assert repr(largest.impression_id) in logged and f"{len(key) + len(value)} bytes" in logged
    assert largest.query_id not in logged and largest.results[0] not in logged
