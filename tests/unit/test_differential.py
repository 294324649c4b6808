"""Differential tests: the replay against trec_eval (linear gain) and ranx (exponential gain).

Both references take the ideal from every judgment of the query (the pool),
so each impression becomes one trec_eval "query" whose qrels are the
judgments of its search query, shown or not. With several judgment sources, the
qrels hold each document's grade by the rule (the first listed source that grades
it), worked out here when the events are made.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay

CUTOFFS = (1, 3, 5, 10, 20)


def generated_events(seed: int, queries: int = 150) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Impressions with unjudged results, and judgments of documents never shown."""
    rnd = random.Random(seed)
    events: list[dict[str, Any]] = []
    qrels_by_query: dict[str, dict[str, int]] = {}
    for q in range(queries):
        query = f"q{q}"
        corpus = [f"{query}-d{d}" for d in range(rnd.randint(5, 40))]
        judged = rnd.sample(corpus, rnd.randint(1, len(corpus)))
        qrels_by_query[query] = {doc: rnd.choice((0, 0, 1, 1, 2, 3, 4)) for doc in judged}
        for doc, grade in qrels_by_query[query].items():
            events.append({"type": "judgment", "query_id": query, "doc_id": doc, "grade": grade,
                           "ts": rnd.randint(0, 10**6)})
        for i in range(rnd.randint(1, 6)):
            shown = rnd.sample(corpus, rnd.randint(1, min(len(corpus), 25)))
            events.append({"type": "impression", "impression_id": f"{query}-i{i}", "query_id": query,
                           "ts": rnd.randint(0, 10**6), "results": shown})
    rnd.shuffle(events)
    return events, qrels_by_query


# Raters first, then COEC; SDBN's judgments are sent and not listed.
ORDER = ("raters", "coec")


def events_of_sources(seed: int, queries: int = 150) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """As `generated_events`, each judged document graded by any of three sources, some grades
    retracted later (its source then has none), and the qrels the rule makes of them."""
    rnd = random.Random(seed)
    events: list[dict[str, Any]] = []
    qrels_by_query: dict[str, dict[str, int]] = {}
    for q in range(queries):
        query = f"q{q}"
        corpus = [f"{query}-d{d}" for d in range(rnd.randint(5, 40))]
        qrels: dict[str, int] = {}
        for n, doc in enumerate(rnd.sample(corpus, rnd.randint(1, len(corpus)))):
            graded: dict[str, int] = {}
            for source in ("raters", "coec", "sdbn"):
                # The first document keeps a rater's grade: trec_eval leaves out a query without qrels.
                if n and rnd.random() < 0.5:
                    continue
                grade = rnd.choice((0, 0, 1, 1, 2, 3, 4))
                ts = rnd.randint(0, 10**6)
                events.append({"type": "judgment", "query_id": query, "doc_id": doc, "grade": grade, "ts": ts,
                               "source": source})
                if n and rnd.random() < 0.3:
                    events.append({"type": "judgment", "query_id": query, "doc_id": doc, "grade": None,
                                   "ts": ts + 1, "source": source})
                else:
                    graded[source] = grade
            found = [graded[source] for source in ORDER if source in graded]
            if found:
                qrels[doc] = found[0]
        qrels_by_query[query] = qrels
        for i in range(rnd.randint(1, 6)):
            shown = rnd.sample(corpus, rnd.randint(1, min(len(corpus), 25)))
            events.append({"type": "impression", "impression_id": f"{query}-i{i}", "query_id": query,
                           "ts": rnd.randint(0, 10**6), "results": shown})
    rnd.shuffle(events)
    return events, qrels_by_query


def replay_per_impression(events: list[dict[str, Any]], gain: str,
                          sources: tuple[str, ...] = ORDER) -> dict[str, dict[str, Any]]:
    replay = Replay(Measure(cutoffs=CUTOFFS, gain=gain, ideal="pool", sources=sources))  # type: ignore[arg-type]
    for event in events:
        assert replay.add(json.dumps(event)) is None
    return {row["impression_id"]: row for row in replay.per_impression()}


def references(events: list[dict[str, Any]], qrels_by_query: dict[str, dict[str, int]]) -> tuple[
        dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for event in events:
        if event["type"] == "impression":
            qrels[event["impression_id"]] = qrels_by_query[event["query_id"]]
            # Strictly decreasing scores: the references must not reorder ties.
            run[event["impression_id"]] = {doc: float(len(event["results"]) - rank)
                                           for rank, doc in enumerate(event["results"])}
    return qrels, run


def check(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[int, float]]) -> int:
    compared = 0
    for impression_id, row in ours.items():
        for k in CUTOFFS:
            value = row["ndcg"][str(k)]
            expected = theirs[impression_id][k]
            if value is None:
                # IDCG 0: undefined here, 0 for the references.
                assert expected == 0.0
            else:
                assert value == pytest.approx(expected, abs=1e-9), (impression_id, k)
                compared += 1
    return compared


@pytest.mark.parametrize(("seed", "make"), [(1, generated_events), (2, generated_events), (4, events_of_sources)])
def test_linear_gain_agrees_with_trec_eval_ndcg_cut(seed: int, make: Any) -> None:
    pytrec_eval = pytest.importorskip("pytrec_eval")
    events, qrels_by_query = make(seed)
    qrels, run = references(events, qrels_by_query)
    measure = "ndcg_cut." + ",".join(str(k) for k in CUTOFFS)
    results = pytrec_eval.RelevanceEvaluator(qrels, {measure}).evaluate(run)
    theirs = {qid: {k: values[f"ndcg_cut_{k}"] for k in CUTOFFS} for qid, values in results.items()}
    assert check(replay_per_impression(events, "linear"), theirs) > 1000


@pytest.fixture(scope="module")
def ranx() -> Any:
    """ranx, imported before a test's hermetic guard (`conftest.hermetic`) is up: its first import on
    a machine has matplotlib list the system's fonts with fc-list, once, into its cache."""
    return pytest.importorskip("ranx")


@pytest.mark.filterwarnings("ignore::Warning")  # numba, under ranx, warns while it compiles
@pytest.mark.parametrize(("seed", "make"), [(3, generated_events), (5, events_of_sources)])
def test_exponential_gain_agrees_with_ranx_ndcg_burges(seed: int, make: Any, ranx: Any) -> None:
    events, qrels_by_query = make(seed)
    qrels, run = references(events, qrels_by_query)
    ranx_run = ranx.Run(run)
    metrics = [f"ndcg_burges@{k}" for k in CUTOFFS]
    ranx.evaluate(ranx.Qrels(qrels), ranx_run, metrics)
    theirs = {qid: {k: float(ranx_run.scores[f"ndcg_burges@{k}"][qid]) for k in CUTOFFS} for qid in run}
    assert check(replay_per_impression(events, "exponential"), theirs) > 1000
