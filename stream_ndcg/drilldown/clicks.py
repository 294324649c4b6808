"""The click evidence of a query's documents, for the drill-down: read from the judge's store.

`stream-ndcg judge` keeps its state under the Redis namespace of the settings (`namespace`, by
default `run`'s `group_id`), so a `run` and a `judge` of one pipeline, on the same Redis with the
same `namespace` (or group id), share it, and `run`'s drill-down reads the judge's grades there
(`state.judge_store.JudgeStore`, read only). Otherwise the answer says why it has none.

Per document holding a grade from clicks: the grade and the boundary it was decided at (`ts`), the
evidence as the judge published it, and the score that evidence gives
(`click_models.score_of_evidence`), so the grade can be checked against the model's thresholds.
A pair below `click_min_impressions` has no grade, and no evidence here.

    evidence = ClickEvidence(wiring.judge_store(settings), settings.key_namespace)
    evidence.of("red shoes", ["search-events:0"], ["d1", "d2"])
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from stream_ndcg.click_models import model_of_evidence, score_of_evidence
from stream_ndcg.errors import ConfigError, StoreUnavailable
from stream_ndcg.state.judge_format import check_judge_format
from stream_ndcg.state.judge_store import Given, JudgeStore

logger = logging.getLogger(__name__)


def unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason, "model": None, "documents": {}}


class ClickEvidence:
    """Reads the judge's grades and evidence of a query's documents."""

    def __init__(self, store: JudgeStore, namespace: str) -> None:
        self.store = store
        self.namespace = namespace

    def of(self, query_id: str, partitions: Collection[str], docs: Collection[str]) -> dict[str, Any]:
        """The documents of `docs` that hold a grade from clicks, read from the query's
        `partitions` (the input partitions its events came from, which the judge's state is kept by)."""
        try:
            found = self.store.recorded_format()
            if found is None:
                return unavailable(f"no click judge keeps its state under namespace {self.namespace!r}: run "
                                   "stream-ndcg judge with this Redis and namespace to see click evidence here")
            check_judge_format(found)
            latest: dict[str, Given] = {}
            pairs = [(query_id, doc) for doc in sorted(docs)]
            for partition in sorted(partitions):
                for (_, doc), given in self.store.graded(partition, pairs).items():
                    # Held by two partitions (the topic was given more): the later grade, as the export.
                    if doc not in latest or given.ts > latest[doc].ts:
                        latest[doc] = given
        except StoreUnavailable as exc:
            logger.warning("drill-down could not read the judge's store: %s", exc)
            return unavailable("the judge's store cannot be read now; retry")
        except ConfigError as exc:
            return unavailable(str(exc))
        models = {model_of_evidence(given.evidence) for given in latest.values()}
        return {"available": True, "reason": None, "model": models.pop() if len(models) == 1 else None,
                "documents": {doc: {"grade": given.grade, "ts": given.ts, "score": score_of_evidence(given.evidence),
                                    "evidence": given.evidence}
                              for doc, given in sorted(latest.items())}}


def of_query(evidence: ClickEvidence | None, query_id: str, partitions: Collection[str], docs: Collection[str],
             sources: Mapping[str, tuple[str, Mapping[str, float | None]]]) -> dict[str, Any]:
    """A query's `clicks` answer: its documents' grades from clicks, each with the other sources'
    grades beside the click model's (a rater's, where there is one)."""
    if evidence is None:
        return unavailable("this drill-down does not read the judge's store")
    clicks = evidence.of(query_id, partitions, docs)
    for doc, entry in clicks["documents"].items():
        entry["other_grades"] = {s: g for s, g in sources.get(doc, ("", {}))[1].items() if s != clicks["model"]}
    return clicks
