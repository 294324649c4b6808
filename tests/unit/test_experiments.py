"""Experiments: their settings, their reconfiguration rules, their cells against a batch
recomputation (hypothesis), and their figures in the API and the replay."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stream_ndcg import reconfigure
from stream_ndcg.config import Settings
from stream_ndcg.drilldown.api import Api
from stream_ndcg.drilldown.experiments import ExperimentReports, report
from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError
from stream_ndcg.experiments import Experiment
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from stream_ndcg.pipeline import BatchPipeline
from stream_ndcg.state.memory import MemoryStore
from tests.support.batches import parsed
from tests.unit.test_properties import _close_json, in_batches, measures, resent_streams

START = "2026-11-20T00:00:00Z"
START_MS = 1_795_132_800_000


def test_experiments_are_read_from_a_toml_array_of_tables_and_take_the_settings_alpha_and_n_star(
        tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(f"""alpha = 0.1
n_star = 500
segment_labels = "variant,engine"
[[experiments]]
name = "ranker-v2"
start = {START}
label = "variant"
arms = ["A", "B", "C"]
control = "A"
[[experiments]]
name = "engine"
start = {START_MS}
end = "2026-12-01T00:00:00+01:00"
label = "engine"
arms = ["bm25", "dense"]
control = "bm25"
alpha = 0.01
n_star = 20000
""")
    settings = Settings.load(config_file=str(path))
    ranker, engine = settings.experiments
    assert ranker == Experiment("ranker-v2", START_MS, "variant", ("A", "B", "C"), "A", 0.1, 500, None)
    assert engine == Experiment("engine", START_MS, "engine", ("bm25", "dense"), "bm25", 0.01, 20_000,
                                1_796_079_600_000)
    # The flag and variable form says the same.
    flag = (f"name=ranker-v2,start={START},label=variant,arms=A|B|C,control=A; name=engine,start={START_MS},"
            "end=2026-12-01T00:00:00+01:00,label=engine,arms=bm25|dense,control=bm25,alpha=0.01,n_star=20000")
    again = Settings.load(flags={"experiments": flag, "alpha": "0.1", "n_star": "500",
                                 "segment_labels": "variant,engine"})
    assert again.experiments == settings.experiments


@pytest.mark.parametrize(("given_value", "message"), [
    ("name=x,start=2026-11-20,label=variant,arms=A|B,control=A", "start '2026-11-20' is not epoch milliseconds"),
    ("name=x,start=1,label=variant,arms=A|B,control=C", "the control 'C' is not one of its arms"),
    ("name=x,start=1,label=variant,arms=A,control=A", "two or more distinct values"),
    ("name=x,start=1,label=variant,arms=A|B", "experiment x: control is missing"),
    ("name=x,start=1,label=variant,arms=A|B,control=A,alpha=1.5", "alpha '1.5' must be between 0 and 1"),
    ("name=x,start=1,label=variant,arms=A|B,control=A,colour=red", "unknown key(s) colour"),
    ("name=x,start=5,end=4,label=variant,arms=A|B,control=A", "end must be after start"),
    ("name=x y,start=1,label=variant,arms=A|B,control=A", "an experiment's name 'x y'"),
    ("name=x,start=1,label=variant,arms=A|B,control=A;name=x,start=1,label=variant,arms=A|B,control=A",
     "x given twice"),
    ("name=x,start=1,label=engine,arms=A|B,control=A", "its label 'engine' is not one of segment_labels"),
    ("name=x,start", "'start' in 'name=x,start' is not key=value"),
])
def test_a_wrong_experiment_is_refused_naming_the_setting_the_experiment_and_the_problem(
        given_value: str, message: str) -> None:
    with pytest.raises(ConfigError, match="setting experiments \\(from --experiments\\)") as caught:
        Settings.load(flags={"experiments": given_value})
    assert message in str(caught.value)


def test_registering_or_closing_an_experiment_is_in_place_and_redefining_one_needs_another_name() -> None:
    base = {"segment_labels": "variant"}
    plain = reconfigure.configured(Settings.load(flags=base))
    assert "experiments" not in plain
    flag = f"name=x,start={START_MS},label=variant,arms=A|B,control=A"
    registered = reconfigure.configured(Settings.load(flags={**base, "experiments": flag}))
    verdict = reconfigure.classify(plain, registered)
    assert verdict.kind == "compatible" and "experiments: x registered" in verdict.changes[0]
    closed = reconfigure.configured(Settings.load(flags={**base, "experiments": flag + ",control=B,end=" + str(
        START_MS + 1)}))
    verdict = reconfigure.classify(registered, closed)
    assert verdict.kind == "compatible"
    assert verdict.changes == ("experiments: x's control, end changed (an end counts no bucket from it on; what was "
                               "counted stays)",)
    moved = reconfigure.configured(Settings.load(flags={**base, "experiments": flag.replace("A|B", "A|C")}))
    verdict = reconfigure.classify(registered, moved)
    assert verdict.kind == "rebuild" and "x's arms changed" in verdict.reasons[0]
    verdict = reconfigure.classify(registered, plain)
    assert verdict.kind == "compatible" and "x no longer registered" in verdict.changes[0]


def replay_of(messages: list[bytes], measure: Measure, dedup_horizon_ms: int | None) -> Replay:
    replay = Replay(measure, dedup_horizon_ms=dedup_horizon_ms)
    for message in messages:
        replay.add(message)
    return replay


# An arm's only impression shows an empty list; a judgment of a document it does not show makes
# its nDCG 0 (scored) under the pool ideal, and the judgment's retraction makes it undefined again.
_UNSCORED_AGAIN = [
    *(orjson.dumps({"type": "impression", "query_id": "q0", "ts": 0, "results": [], "impression_id": f"i{serial}"})
      for serial in range(23)),
    b'{"type": "impression", "query_id": "q0", "ts": 0, "results": [], "segment": {"variant": "A"}, '
    b'"impression_id": "i23"}',
    b'{"type": "judgment", "query_id": "q0", "doc_id": "d3", "grade": 1, "ts": 0}',
    b'{"type": "judgment", "query_id": "q0", "doc_id": "d3", "grade": null, "ts": 0, "event_id": "a"}',
]


@given(resent_streams(), measures, st.lists(st.integers(1, 6), min_size=60, max_size=60),
       st.sampled_from([None, 60_000, 180_000]), st.randoms(use_true_random=False), st.integers(0, 6))
@example(_UNSCORED_AGAIN, Measure(cutoffs=(1, 3), gain="exponential", ideal="pool", sources=("raters", "coec", "sdbn")),
         [1] * 60, None, random.Random(1), 0)
def test_experiment_cells_equal_the_batch_recomputation_after_every_batch_in_any_order(
        messages: list[bytes], measure: Measure, batch_sizes: list[int], dedup_horizon_ms: int | None,
        rnd: Any, start_minute: int) -> None:
    # Any order: late judgments re-credit the groups an experiment counted, resent impressions are
    # duplicates (or new ones behind the dedup horizon), and buckets before the start never count.
    messages = [*messages]
    rnd.shuffle(messages)
    experiment = Experiment("e", start_minute * 60_000, "variant", ("A", "B"), "A", 0.05, 100)
    engine = Engine(measure, dedup_horizon_ms=dedup_horizon_ms, query_credits=True)
    store = MemoryStore(dedup_horizon_ms=dedup_horizon_ms)
    pipeline = BatchPipeline(store, engine, event_clock=dedup_horizon_ms is not None, experiments=[experiment])
    epoch = store.claim("t:0")
    for batch, position in in_batches(messages, batch_sizes):
        pipeline.apply("t:0", epoch, parsed(batch), position, store.next_offset("t:0"))
        replay = replay_of(messages[:position], measure, dedup_horizon_ms)
        expected = replay.experiment_cells(experiment)
        cells = store.experiment("e").cells
        assert {cell for cell, value in expected.items() if value} <= cells.keys() <= expected.keys()
        for cell, value in expected.items():
            assert abs(cells.get(cell, 0.0) - value) <= 1e-9, cell
        assert _close_json(report(experiment, cells, measure.cutoffs), report(experiment, expected, measure.cutoffs))


def _stream(seed: int, impressions: int = 400) -> list[bytes]:
    """Impressions of arms A and B over ten queries, judged as they go, and late judgments of
    documents already shown."""
    rng = __import__("random").Random(seed)
    messages = []
    for serial in range(impressions):
        query = f"q{rng.randrange(10)}"
        variant = "AB"[serial % 2]
        results = rng.sample([f"d{i}" for i in range(12)], 6)
        messages.append({"type": "impression", "impression_id": f"i{serial}", "query_id": query,
                         "ts": START_MS + serial * 1000, "results": results, "segment": {"variant": variant}})
        if serial % 3 == 0:
            messages.append({"type": "judgment", "query_id": query, "doc_id": rng.choice(results),
                             "grade": rng.randrange(4), "ts": START_MS + serial * 1000})
    for serial in range(60):
        messages.append({"type": "judgment", "query_id": f"q{serial % 10}", "doc_id": f"d{serial % 12}",
                         "grade": 3, "ts": START_MS + (impressions + serial) * 1000})
    return [json.dumps(m).encode() for m in messages]


def test_the_api_gives_each_experiment_the_replays_figures(tmp_path: Path) -> None:
    messages = _stream(3)
    flag = f"name=x,start={START},label=variant,arms=A|B,control=A,n_star=300"
    settings = Settings.load(flags={"experiments": flag, "k": "3,5", "clock": "event"})
    store = MemoryStore(bucket_ms=settings.bucket, horizon_ms=settings.horizon)
    engine = Engine(settings.measure, settings.bucket, horizon_ms=settings.horizon, query_credits=True)
    pipeline = BatchPipeline(store, engine, event_clock=True, experiments=settings.experiments)
    epoch = store.claim("t:0")
    for batch, position in in_batches(messages, [50] * 20):
        pipeline.apply("t:0", epoch, parsed(batch), position, store.next_offset("t:0"))
    api = Api(explorer=None, experiments=ExperimentReports(store, settings.experiments, settings.k,  # type: ignore[arg-type]
                                                           settings.bucket))
    status, body, _ = api.answer("/api/v1/experiments", {})
    assert status == 200
    listing = orjson.loads(body)
    assert [e["name"] for e in listing["experiments"]] == ["x"]
    status, body, _ = api.answer("/api/v1/experiments/x", {})
    served = orjson.loads(body)
    assert served == listing["experiments"][0]
    assert served["counting_from_ms"] == START_MS and served["open"] and served["alpha_each"] == 0.05
    comparison = served["k"]["5"]["comparisons"]["B"]
    assert comparison["plain"]["standard_error"] > 0 and comparison["stratified"]["standard_error"] > 0
    assert served["k"]["5"]["arms"]["A"]["scored_impressions"] > 0
    assert api.answer("/api/v1/experiments/nothing", {})[0] == 404
    # `stream-ndcg replay` on the same events gives the same figures.
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(messages) + b"\n")
    done = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "replay", str(events), "--k", "3,5",
                           "--experiments", flag], capture_output=True, check=True)
    replayed = json.loads(done.stdout)["experiments"]["x"]
    assert _close_json(replayed, json.loads(json.dumps(served)))
