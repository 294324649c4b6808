"""The history for Prometheus: its OpenMetrics text, and its samples against the service's gauges."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from stream_ndcg.cli import main
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.events import InvalidEvent, parse_event
from stream_ndcg.offline.history import WINDOW_GAUGES, History, OpenMetricsWriter, settings_of
from tests.support.history import read_openmetrics, service_gauges

# A minute boundary: buckets of 1m start here.
BASE = 28_333_334 * 60_000


def test_writer_groups_each_series_in_time_order_and_spells_openmetrics() -> None:
    writer = OpenMetricsWriter()
    odd = 'x"y\\z\n'
    # Added time after time, as the history scrapes; written series after series.
    writer.add("a", 'An "a" \\ of\nlines.', {"k": "5", "seg": odd}, 0.5, 60_000)
    writer.add("b", "A b.", {"k": "5"}, math.nan, 60_000)
    writer.add("a", "ignored: the first help holds", {"k": "10"}, 1e-05, 60_000)
    writer.add("a", "", {"k": "5", "seg": odd}, 0.1 + 0.2, 120_500)
    writer.add("b", "", {"k": "5"}, 3.0, 120_500)
    writer.add("a", "", {"k": "10"}, math.inf, 120_500)
    out = io.StringIO()
    writer.write(out)
    assert out.getvalue() == (
        '# HELP a An \\"a\\" \\\\ of\\nlines.\n'
        "# TYPE a gauge\n"
        'a{k="5",seg="x\\"y\\\\z\\n"} 0.5 60\n'
        'a{k="5",seg="x\\"y\\\\z\\n"} 0.30000000000000004 120.500\n'
        'a{k="10"} 1e-05 60\n'
        'a{k="10"} +Inf 120.500\n'
        "# HELP b A b.\n"
        "# TYPE b gauge\n"
        'b{k="5"} NaN 60\n'
        'b{k="5"} 3.0 120.500\n'
        "# EOF\n")
    # Another parser reads every value back exactly, the odd label value and NaN included.
    samples = read_openmetrics(out.getvalue())
    assert samples[("a", (("k", "5"), ("seg", odd)), 120_500)] == 0.1 + 0.2
    assert samples[("a", (("k", "10"),), 60_000)] == 1e-05
    assert math.isnan(samples[("b", (("k", "5"),), 60_000)])
    assert len(samples) == 6


def test_writer_refuses_a_series_going_back_in_time() -> None:
    writer = OpenMetricsWriter()
    writer.add("a", "An a.", {"k": "5"}, 1.0, 120_000)
    writer.add("a", "An a.", {"k": "10"}, 1.0, 60_000)  # another series: its own time
    with pytest.raises(ValueError, match="after one at 120000 ms"):
        writer.add("a", "An a.", {"k": "5"}, 1.0, 120_000)


def _event(kind: str, ts: int, **fields: object) -> bytes:
    return json.dumps({"type": kind, "query_id": "q", "ts": BASE + ts, **fields}).encode()


def test_each_sample_is_what_the_service_showed_at_its_bucket_end() -> None:
    history = History(settings_of(k=(1,), bucket="1m", windows="1m,2m", segment_labels="variant"))
    for line in (
        _event("impression", 1_000, impression_id="i1", results=["d1", "d2"], segment={"variant": "A"}),
        b"not an event: rejected, and no clock",
        # Into the next bucket: the first is recorded at BASE + 1m, with no judgment known yet.
        _event("impression", 61_000, impression_id="i2", results=["d2", "d1"], segment={"variant": "A"}),
        _event("judgment", 62_000, doc_id="d2", grade=3),
        # Two buckets on: the second is recorded, with the judgment; the third, skipped, is not.
        _event("impression", 181_000, impression_id="i3", results=["d2"], segment={"variant": "A"}),
    ):
        history.add(line)
    out = io.StringIO()
    history.write(out)
    samples = read_openmetrics(out.getvalue())

    def at(name: str, window: str, minutes: int) -> float:
        labels = {"pipeline": "stream-ndcg", "window": window, "variant": "A"}
        if name != "stream_ndcg_impressions":
            labels["k"] = "1"
        return samples[(name, tuple(sorted(labels.items())), BASE + minutes * 60_000)]

    assert {ts for _, _, ts in samples} == {BASE + 60_000, BASE + 120_000, BASE + 240_000}
    assert at("stream_ndcg_impressions", "1m", 1) == 1
    assert math.isnan(at("stream_ndcg_ndcg", "1m", 1))
    assert at("stream_ndcg_scored_impressions", "2m", 1) == 0
    # The judgment re-scores i1 for the samples after it arrived: d1 at rank 1 is unjudged.
    assert at("stream_ndcg_ndcg", "1m", 2) == 1.0
    assert at("stream_ndcg_ndcg", "2m", 2) == 0.5
    assert at("stream_ndcg_impressions", "2m", 2) == 2
    assert at("stream_ndcg_ndcg", "2m", 4) == 1.0
    assert at("stream_ndcg_impressions", "2m", 4) == 1
    assert {name for name, _, _ in samples} == set(WINDOW_GAUGES)


def _before(messages: list[tuple[bytes, bytes]], end_ms: int) -> list[tuple[bytes, bytes]]:
    """The messages that arrived before the first one whose time is `end_ms` or later."""
    for index, (_, value) in enumerate(messages):
        event = parse_event(value)
        if not isinstance(event, InvalidEvent) and event.ts >= end_ms:
            return messages[:index]
    return messages


def test_samples_equal_the_service_after_the_same_events() -> None:
    """At a few bucket ends and the last: every gauge equals what the service, fed the events
    that had arrived by then in its own batches, reports (to 1e-9)."""
    spec = SimulationSpec(events=4_000, seed=11, queries=150, rate=0.5, engines=("web", "app"),
                          malformed_share=0.01, max_delay_ms=1_800_000, start_ms=BASE)
    messages = list(Simulator(spec).messages())
    settings = settings_of(k=(3, 10), bucket="1m", windows="5m,30m,1h", segment_labels="variant,engine",
                           pipeline="backfill")
    history = History(settings)
    for _, value in messages:
        history.add(value)
    out = io.StringIO()
    history.write(out)
    samples = read_openmetrics(out.getvalue())
    times = sorted({ts for _, _, ts in samples})
    # About two hours and a quarter of event time, one sample a minute.
    assert len(times) > 120
    compared = 0
    for end in (times[10], times[len(times) // 2], times[-1]):
        expected = service_gauges(_before(messages, end), settings)
        got = {(name, labels): value for (name, labels, ts), value in samples.items() if ts == end}
        assert got.keys() == expected.keys()
        for key, number in expected.items():
            assert (math.isnan(got[key]) and math.isnan(number)) or got[key] == pytest.approx(number, abs=1e-9), key
            compared += 1
    assert compared > 3 * 100


def test_replay_writes_the_history_and_refuses_its_flags_without_it(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join((
        _event("impression", 1_000, impression_id="i1", results=["d1"]),
        _event("judgment", 2_000, doc_id="d1", grade=1),
    )) + b"\n")
    out = tmp_path / "history.om"
    assert main(["replay", str(events), "--openmetrics", str(out), "--windows", "1m", "--pipeline", "p"]) == 0
    samples = read_openmetrics(out.read_text())
    key = ("stream_ndcg_ndcg", (("k", "10"), ("pipeline", "p"), ("variant", "none"), ("window", "1m")), BASE + 60_000)
    assert samples[key] == 1.0
    assert main(["replay", str(events), "--windows", "1m"]) == 2
    assert main(["replay", str(events), "--openmetrics", str(tmp_path / "missing" / "h.om")]) == 2
    assert main(["replay", str(events), "--openmetrics", str(out), "--windows", "90s", "--bucket", "1m"]) == 2
