"""The seeds' worked examples (shared/seeds) as test vectors for the metric core."""

from __future__ import annotations

import math
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg import metric
from stream_ndcg.metric import (
    GAINS,
    IDEALS,
    Gain,
    Ideal,
    ListScorer,
    Measure,
    cumulative_gain,
    dcg,
    discount,
    gain,
    ideal_dcg,
    ndcg,
    score_list,
)

SEED_DOCS = ["D1", "D2", "D3", "D4", "D5", "D6"]
SEED_GRADES = {"D1": 3.0, "D2": 2.0, "D3": 3.0, "D4": 0.0, "D5": 1.0, "D6": 2.0}
# The seed's extension: two more judged documents that the list never showed.
SEED_UNSHOWN = {"D7": 3.0, "D8": 2.0}


def test_cumulative_gain_of_the_seed_is_11() -> None:
    assert cumulative_gain(SEED_GRADES[d] for d in SEED_DOCS) == 11


def test_discount_is_one_over_log2_of_rank_plus_one() -> None:
    assert discount(1) == 1.0
    assert discount(3) == 0.5
    assert discount(2) == pytest.approx(1 / 1.585, abs=1e-3)


def test_threads_growing_the_discount_table_at_once_leave_every_rank_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine and the drill-down API's threads share the table. A thread switch after almost
    # every bytecode makes an unguarded grow-then-append interleave within a few hundred ranks.
    monkeypatch.setattr(metric, "_DISCOUNTS", [0.0])
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        start = threading.Barrier(8)

        def grow() -> None:
            start.wait()
            discount(3_000)

        threads = [threading.Thread(target=grow) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert len(metric._DISCOUNTS) == 3_001
    assert [rank for rank in range(1, 3_001) if metric._DISCOUNTS[rank] != 1.0 / math.log2(rank + 1)] == []


def test_seed_dcg_idcg_and_ndcg_with_linear_gain() -> None:
    gains = [SEED_GRADES[d] for d in SEED_DOCS]
    assert round(dcg(gains, 6), 3) == 6.861
    assert round(ideal_dcg(gains, 6), 3) == 7.141
    value = ndcg(dcg(gains, 6), ideal_dcg(gains, 6))
    assert value is not None and round(value, 3) == 0.961


def test_seed_with_two_more_judged_documents_uses_the_pool() -> None:
    grades = SEED_GRADES | SEED_UNSHOWN
    pooled = score_list(SEED_DOCS, grades, Measure(cutoffs=(6,), gain="linear", ideal="pool"))
    assert round(pooled.dcg[6], 3) == 6.861
    assert round(ideal_dcg(grades.values(), 6), 3) == 8.740
    assert pooled.ndcg[6] is not None and round(pooled.ndcg[6], 3) == 0.785
    # The list ideal ignores documents the list did not show: the 0.961 of the seed.
    listed = score_list(SEED_DOCS, grades, Measure(cutoffs=(6,), gain="linear", ideal="list"))
    assert listed.ndcg[6] is not None and round(listed.ndcg[6], 3) == 0.961


def test_seed_four_documents_dcg() -> None:
    # Seed 001: D1..D4 graded 3, 2, 3, 0 gives DCG@4 5.762. It prints IDCG 5.898 and nDCG
    # 0.976, an arithmetic slip: 3 + 3/log2(3) + 2/2 + 0 is 5.893, and 5.762 / 5.893 is 0.978.
    score = score_list(SEED_DOCS[:4], SEED_GRADES, Measure(cutoffs=(4,), gain="linear", ideal="list"))
    assert round(score.dcg[4], 3) == 5.762
    assert round(ideal_dcg([3.0, 2.0, 3.0, 0.0], 4), 3) == 5.893
    assert score.ndcg[4] is not None and round(score.ndcg[4], 3) == 0.978


def test_exponential_gain_is_two_to_the_grade_minus_one() -> None:
    assert gain(3, "exponential") == 7.0
    assert gain(0, "exponential") == 0.0
    assert gain(0.5, "exponential") == pytest.approx(math.sqrt(2) - 1)
    assert gain(3, "linear") == 3.0
    score = score_list(SEED_DOCS, SEED_GRADES, Measure(cutoffs=(6,), gain="exponential", ideal="list"))
    expected = 7 + 3 / math.log2(3) + 7 / 2 + 0 + 1 / math.log2(6) + 3 / math.log2(7)
    assert score.dcg[6] == pytest.approx(expected, abs=1e-12)


def test_unjudged_results_keep_their_rank_and_count_in_the_judged_ratio() -> None:
    score = score_list(["x", "D1", "y", "D3"], SEED_GRADES, Measure(cutoffs=(2, 4), gain="linear", ideal="list"))
    assert score.dcg[4] == pytest.approx(3 / math.log2(3) + 3 / math.log2(5))
    assert score.judged_ratio == {2: 0.5, 4: 0.5}


def test_short_lists_are_penalised_at_k() -> None:
    # Seed limitation 2: {1,1,1} against a pool of five relevant documents at k=5.
    grades = {f"d{i}": 1.0 for i in range(5)}
    measure = Measure(cutoffs=(5,), gain="linear", ideal="pool")
    short = score_list(["d0", "d1", "d2"], grades, measure)
    full = score_list(["d0", "d1", "d2", "d3", "d4"], grades, measure)
    assert full.ndcg[5] == pytest.approx(1.0)
    assert short.ndcg[5] is not None and short.ndcg[5] < 1.0
    assert short.judged_ratio[5] == pytest.approx(3 / 5)


def test_negative_grades_count_in_dcg_but_never_in_the_ideal() -> None:
    grades = {"good": 1.0, "bad": -1.0}
    score = score_list(["bad", "good"], grades, Measure(cutoffs=(2,), gain="linear", ideal="pool"))
    assert score.dcg[2] == pytest.approx(-1.0 + 1 / math.log2(3))
    assert score.ndcg[2] == pytest.approx(-1.0 + 1 / math.log2(3))


def test_a_repeated_document_counts_only_at_its_first_rank() -> None:
    grades = {"a": 1.0}
    score = score_list(["a", "a", "b"], grades, Measure(cutoffs=(3,), gain="linear", ideal="pool"))
    assert score.dcg[3] == 1.0
    assert score.judged_ratio[3] == pytest.approx(1 / 3)


def test_ideal_dcg_of_zero_gives_an_undefined_ndcg() -> None:
    score = score_list(["a", "b"], {"a": 0.0}, Measure(cutoffs=(2,), gain="exponential", ideal="pool"))
    assert score.ndcg[2] is None
    assert score.dcg[2] == 0.0
    assert score.judged_ratio[2] == 0.5
    assert score_list([], {}, Measure()).ndcg == {5: None, 10: None}


@pytest.mark.parametrize("gain_formula", ["linear", "exponential"])
def test_at_the_limits_of_a_grade_every_score_is_finite(gain_formula: str) -> None:
    measure = Measure(cutoffs=(10,), gain=gain_formula, ideal="pool")  # type: ignore[arg-type]
    shown = [f"bad{i}" for i in range(9)] + ["good"]

    def scores(smallest: float) -> list[float | None]:
        grades = {"good": smallest, **dict.fromkeys(shown[:-1], -metric.MAX_ABS_GRADE)}
        score = score_list(shown, grades, measure)
        return [score.dcg[10], score.ndcg[10]]

    assert all(value is None or math.isfinite(value) for value in scores(metric.MIN_ABS_GRADE))
    if gain_formula == "linear":
        # What the lower limit keeps out: an ideal of one tinier grade, and an nDCG of -inf.
        assert scores(5e-324)[1] == -math.inf


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cutoffs": ()}, "at least one"),
        ({"cutoffs": (0,)}, "positive"),
        ({"cutoffs": (5, 5)}, "distinct"),
        ({"gain": "cubic"}, "gain"),
        ({"ideal": "oracle"}, "ideal"),
    ],
)
def test_a_measure_rejects_bad_parameters(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Measure(**kwargs)  # type: ignore[arg-type]


@given(st.lists(st.sampled_from("abcdefghij"), max_size=14),
       st.dictionaries(st.sampled_from("abcdefghijkl"), st.sampled_from([-2.0, -0.0, 0.0, 0.5, 1.0, 3.0])),
       st.lists(st.integers(1, 12), min_size=1, max_size=3, unique=True),
       st.sampled_from(GAINS), st.sampled_from(IDEALS))
def test_a_list_is_scored_as_the_definitions_say(results: list[str], grades: dict[str, float], cutoffs: list[int],
                                                  gain_formula: Gain, ideal: Ideal) -> None:
    """`score_list`, and `ListScorer` (the replay's way), against the definitions written out with
    `dcg` and `ideal_dcg`, bit for bit: repeats, short lists, zero, negative and unshown grades."""
    measure = Measure(cutoffs=tuple(cutoffs), gain=gain_formula, ideal=ideal)
    ranked = [(rank, doc) for rank, doc in enumerate(results[:measure.depth], start=1)
              if doc not in results[:rank - 1]]
    gains_by_rank = [0.0] * min(len(results), measure.depth)
    for rank, doc in ranked:
        if doc in grades:
            gains_by_rank[rank - 1] = measure.gain_of(grades[doc])
    pool = grades.values() if ideal == "pool" else [grades[doc] for _, doc in ranked if doc in grades]
    for score in (score_list(results, grades, measure), ListScorer(grades, measure).score(results)):
        for k in cutoffs:
            # repr: a negative zero would differ from the definition's zero.
            assert repr(score.dcg[k]) == repr(dcg(gains_by_rank, k))
            ideal_value = ideal_dcg([measure.gain_of(g) for g in pool], k)
            assert repr(score.ndcg[k]) == repr(ndcg(dcg(gains_by_rank, k), ideal_value))
            assert score.judged_ratio[k] == sum(1 for rank, doc in ranked if rank <= k and doc in grades) / k
