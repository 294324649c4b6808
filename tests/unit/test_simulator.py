"""The simulator: reproducible, realistic in shape, and the better variant really is better."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from stream_ndcg.cli import main
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay


def test_same_seed_same_events() -> None:
    spec = SimulationSpec(events=500, seed=4)
    assert list(Simulator(spec).messages()) == list(Simulator(spec).messages())
    assert list(Simulator(spec).messages()) != list(Simulator(SimulationSpec(events=500, seed=5)).messages())


def test_shape_of_the_traffic() -> None:
    spec = SimulationSpec(events=20_000, seed=2, malformed_share=0.01, max_delay_ms=600_000, rate=20.0)
    messages = list(Simulator(spec).messages())
    assert len(messages) == 20_000
    events = []
    for _, value in messages:
        try:
            events.append(json.loads(value))
        except (ValueError, UnicodeDecodeError):
            continue
    events = [e for e in events if isinstance(e, dict) and "query_id" in e and "ts" in e]
    kinds = Counter(e["type"] for e in events)
    # A third of the ten shown documents are judged, a few unshown ones too, some revised.
    assert 1.5 < kinds["judgment"] / kinds["impression"] < 4.5
    assert 100 < 20_000 - len(events) < 300
    queries = Counter(e["query_id"] for e in events if e["type"] == "impression")
    top = queries.most_common()
    assert top[0][1] > 20 * top[len(top) // 2][1], "query frequencies should be Zipf-like"
    judgments = [e for e in events if e["type"] == "judgment" and "grade" in e]
    assert any(j["grade"] is None for j in judgments), "some judgments are retracted"
    impressions = {e["query_id"]: e["ts"] for e in events if e["type"] == "impression"}
    delays = [j["ts"] - impressions[j["query_id"]] for j in judgments if j["query_id"] in impressions]
    assert max(delays) > 60_000, "judgments arrive late"


def test_the_better_variant_scores_higher(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"
    assert main(["simulate", "--events", "20000", "--seed", "3", "--output", str(out), "--max-delay-ms", "60000"]) == 0
    replay = Replay(Measure(cutoffs=(10,)))
    for line in out.read_bytes().splitlines():
        replay.add(line)
    by_variant = replay.summary()["by_segment"]["variant"]
    assert by_variant["A"]["10"]["ndcg_mean"] > by_variant["B"]["10"]["ndcg_mean"] + 0.1


def test_event_time_advances_at_the_rate_the_spec_claims() -> None:
    spec = SimulationSpec(events=10_000, seed=6, rate=250.0, max_delay_ms=60_000)
    stamps = [json.loads(value)["ts"] for _, value in Simulator(spec).messages()]
    newest = max(stamps) - spec.start_ms
    # 10,000 events at 250 per second: 40 s of event time (the last judgments may run ahead a little).
    assert 39_000 < newest < 42_000, newest


def test_with_a_clock_every_event_carries_the_time_it_is_generated() -> None:
    now = [1_800_000_000_000]

    def clock() -> int:
        now[0] += 7
        return now[0]

    spec = SimulationSpec(events=3_000, seed=6, max_delay_ms=5_000)
    kinds: Counter[str] = Counter()
    for _, value in Simulator(spec, clock=clock).messages():
        event = json.loads(value)
        kinds[event["type"]] += 1
        if event["type"] == "impression":
            assert event["ts"] == now[0]
        else:
            # A judgment waits until the clock has passed its time.
            assert event["ts"] <= now[0]
    assert kinds["judgment"] > 0


def test_clicks_follow_the_position_based_model_and_leave_the_other_events_as_they_were() -> None:
    plain = list(Simulator(SimulationSpec(events=6_000, seed=8, rate=20.0)).messages())
    clicked = list(Simulator(SimulationSpec(events=12_000, seed=8, rate=20.0, clicks=True)).messages())
    others = [m for m in clicked if json.loads(m[1])["type"] != "click"]
    assert others[: len(plain)] == plain
    searches = {e["impression_id"]: e for e in map(json.loads, (v for _, v in clicked)) if e["type"] == "impression"}
    ranks: Counter[int] = Counter()
    for event in (json.loads(v) for _, v in clicked):
        if event["type"] == "click":
            search = searches[event["impression_id"]]
            assert search["query_id"] == event["query_id"] and 0 < event["ts"] - search["ts"] <= 65_000
            ranks[search["results"].index(event["doc_id"]) + 1] += 1
    # Examined with probability 1/rank, and the better documents are ranked higher.
    assert ranks[1] > 2 * ranks[3] > 0 and ranks[3] > ranks[10]


def test_click_judgments_rank_the_better_variant_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.jsonl"
    # 30,000 messages at 10 events a second: about half an hour of event time.
    assert main(["simulate", "--events", "30000", "--seed", "3", "--rate", "10", "--clicks", "--output", str(out)]) == 0
    for model in ("coec", "sdbn"):
        flags = ["--click-model", model, "--judge-interval", "5m", "--click-session", "2m"]
        assert main(["replay", str(out), *flags]) == 0
        summary = json.loads(capsys.readouterr().out)
        by_variant = summary["by_segment"]["variant"]
        assert summary["click_judgments"]["judgments"] > 100, model
        assert by_variant["A"]["10"]["ndcg_mean"] > by_variant["B"]["10"]["ndcg_mean"] + 0.1, model
