"""When `judge` decides a boundary: every partition of the input topics is past it first.

COEC's CTR(r) is every partition's, so the grades of boundary B must not depend on how the
partitions interleave: a partition whose clock passes B closes it (`close`: its ended sessions
counted, its old buckets forgotten, its rank counts over B's horizon kept with the commit) and
waits, taking in nothing more, until every partition is past B; then the rank counts they closed
it with, summed, grade each one's pairs (`decidable`).

A partition whose clock started past B took nothing in before B: it is past B without closing
it, contributes no rank counts to it and grades nothing at it (its first boundary is the first
one after its clock started). That is the partition whose first event comes after B, whether the
others already closed B or it reads ahead of them (event clock), and the one first claimed after
the wall passed B, however long the cycle that claimed it (wall clock). Each partition closes
every boundary after its start once, in order, so "past B" is one reading of its status
(`Status.past`), whatever order the partitions were read in.

A partition with nothing to read would hold every boundary back. `idle_boundary` is the rule
for it: a partition read to the end of its log for `judge_idle` closes its next boundary as soon
as another partition waits at it or at a later one (a partition that never had an event takes
the earliest boundary waited at), as Flink's sources mark a split idle after a timeout and leave
it out of the watermark. An event that reaches it later for a time before that boundary is taken
in after the boundary, as a late event (docs/click-judgments.md says when the replay matches).

On the wall clock every partition's clock is the wall time, so none holds a boundary back for
want of events: each closes B once the wall passes B, records or not (`ClickJudge.due`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection

import orjson

from stream_ndcg.click_judge import ClickJudge
from stream_ndcg.click_models import RankCounts, summed
from stream_ndcg.state.judge_store import JudgeStore, Status


def waiting_at(judge: ClickJudge) -> int | None:
    """The boundary a judge closed and has not decided yet."""
    return Status(judge.clock_ms, judge.closed).waiting


def close(judge: ClickJudge, boundary: int) -> tuple[int, list[list[int]]]:
    """Close `boundary`; the judge's rank counts over its horizon then, [shown, clicked], to commit
    with it."""
    judge.close(boundary)
    ranks = judge.stats.rank_counts(judge.oldest_bucket(boundary))
    return boundary, [ranks.shown, ranks.clicked]


def decide(judge: ClickJudge, boundary: int, ctr: RankCounts) -> tuple[list[bytes], dict[str, str]]:
    """Emit `boundary`'s judgments with every partition's rank counts: the events to publish, and
    the figures the exporter reads (pairs by grade, the CTR it was decided with)."""
    outbox = [orjson.dumps(j.message()) for j in judge.emit(boundary, ctr)]
    grades = Counter(f"{grade:g}" for grade in judge.graded.values())
    return outbox, {"grades": orjson.dumps(dict(sorted(grades.items()))).decode(),
                    "ctr": orjson.dumps([boundary, ctr.shown, ctr.clicked]).decode()}


def decidable(boundary: int, partitions: Collection[str], statuses: Callable[[], dict[str, Status]],
              store: JudgeStore, max_rank: int) -> RankCounts | None:
    """Every partition's rank counts at `boundary`, summed, once each is past it; None before (or
    while the partitions of the input topics are not known). A partition past `boundary` without
    rank counts stored for it started after it: it has none to add."""
    if not partitions:
        return None
    found = statuses()
    if not all(status.past(boundary) for status in found.values()):
        return None
    closed = store.closed_ranks(partitions, boundary)
    return summed((RankCounts(r[0], r[1]) for r in closed.values() if r is not None), max_rank)


def idle_boundary(partition: str, judge: ClickJudge, statuses: dict[str, Status]) -> int | None:
    """The boundary an idle partition closes: its next one, if another partition waits at it or at
    a later one; for a partition that never had an event, the earliest one waited at."""
    waited = [s.waiting for name, s in statuses.items() if name != partition and s.waiting is not None]
    if not waited:
        return None
    earliest = min(waited)
    own = judge.next_boundary()
    if own is None:
        return earliest
    return own if own <= earliest else None
