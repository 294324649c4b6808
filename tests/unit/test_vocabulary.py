"""The catalogue of names, pinned: these spellings are stored in Redis and scraped by dashboards."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg import metric, setting_values, vocabulary, windows
from stream_ndcg.core_build import PACKAGE_DIR
from stream_ndcg.vocabulary import (
    MISSING,
    MetricName,
    dcg_at,
    duplicate,
    full_segment_key,
    judged_at,
    ndcg_at,
    rejected,
    rejection_reason,
    scored_at,
    segment_values,
    total,
)


def test_stored_names_keep_their_spelling() -> None:
    # A change here is a change of state_format.FORMAT_VERSION, not a rename.
    assert (vocabulary.IMPRESSIONS, dcg_at(5), ndcg_at(5), scored_at(5), judged_at(5)) == (
        "impressions", "dcg@5", "ndcg@5", "scored@5", "judged@5")
    assert (vocabulary.MOMENTS, vocabulary.dcg_squares_at(5), vocabulary.ndcg_squares_at(5)) == (
        "moments", "dcg_sq@5", "ndcg_sq@5")
    assert (vocabulary.EVENT_TYPES, duplicate("judgment"), rejected("too_old")) == (
        ("impression", "judgment", "click"), "duplicate:judgment", "rejected:too_old")
    assert (vocabulary.MISSING, vocabulary.OVERFLOW) == ("none", "other")
    assert full_segment_key((("variant", "B"), ("engine", "web"))) == '{"engine":"web","variant":"B"}'


def test_exported_names_keep_their_spelling() -> None:
    names = {value for name, value in vars(MetricName).items() if name.isupper() and name != "PREFIX"}
    assert names == {f"stream_ndcg_{n}" for n in (
        "events", "events_rejected", "events_duplicate", "judgments", "judgments_unlisted_source", "ndcg",
        "ndcg_numerator", "scored_impressions", "dcg", "dcg_numerator", "judged_ratio", "judged_ratio_numerator",
        "impressions", "build", "batch_duration_seconds", "batch_events", "judgment_to_metric_seconds",
        "redis_round_trip_seconds", "state_cache_lookups", "state_cache_evictions", "state_cache_states",
        "state_cache_estimated_bytes", "consumer_lag", "consumer_held_back_offsets", "assigned_partitions", "backoffs",
        "offsets_skipped", "fenced_batches", "dead_letters_dropped", "scrape_errors", "ready", "ubi_documents",
        "ubi_skipped", "ubi_clicks", "ubi_impressions", "judge_events", "judge_events_rejected",
        "judge_events_duplicate", "judge_graded_pairs", "judge_ctr", "judge_boundary_timestamp_seconds",
        "judgments_published", "judgments_too_large", "ndcg_squares", "dcg_squares", "squared_impressions",
        "ndcg_standard_error",
        "dcg_standard_error", "ndcg_clustered_standard_error", "dcg_clustered_standard_error", "ndcg_query_mean",
        "queries", "query_figures_timestamp_seconds")}
    assert total(MetricName.EVENTS) == "stream_ndcg_events_total"


@pytest.mark.parametrize("key", ["impression", "duplicate:impression", "rejected", "xrejected:a"])
def test_only_rejected_keys_have_a_reason(key: str) -> None:
    assert rejection_reason(key) is None


def test_a_reason_comes_back_whole() -> None:
    assert rejection_reason(rejected("bad:field")) == "bad:field"


@given(st.dictionaries(st.sampled_from(["variant", "engine", "locale"]), st.text(max_size=5)))
def test_a_segment_key_gives_back_the_values_of_its_labels(segment: dict[str, str]) -> None:
    labels = ("variant", "engine", "locale")
    key = full_segment_key(tuple(segment.items()))
    assert segment_values(key, labels) == [segment.get(label, MISSING) for label in labels]


def test_an_empty_segment_key_has_every_label_missing() -> None:
    assert segment_values("", ("variant",)) == [MISSING]


@pytest.mark.parametrize("module", [vocabulary, windows, metric, setting_values])
def test_the_module_examples_hold(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # The examples are read from the source (a compiled module's functions are not ones doctest
    # finds) and run against the module that runs, compiled or not.
    spec = importlib.util.spec_from_file_location(f"{module.__name__}_source",
                                                  PACKAGE_DIR / f"{module.__name__.rsplit('.')[-1]}.py")
    assert spec is not None and spec.loader is not None
    source = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, source)  # dataclasses look their module up
    spec.loader.exec_module(source)
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(source, module.__name__, globs=vars(module)):
        runner.run(test)
    failed, tried = runner.summarize(verbose=False)
    assert tried and not failed
