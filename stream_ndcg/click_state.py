"""A click judge's state as plain data: what a store keeps, and the changes a commit writes.

Pure: standard library only. `ClickJudge.state()` gives the whole state as a
`JudgeState`, `ClickJudge.changes()` what changed since the last call in the
same shape (removals as None, buckets of pair counts forgotten whole in
`forgotten`), and `ClickJudge.from_state` makes a judge again that goes on
exactly as the one saved would have (a property test holds them to it).
`merged` applies changes to a saved state, as a store does; the stored form
(hash fields, JSON) is `state.judge_format`'s.

Sections, each a flat mapping so that a store keeps each as one hash (the
pair counts one hash per bucket):

- `meta`: the judge's scalars (clock, last boundary closed, serial of held clicks, ...) and
  `counts`, its events by type, duplicate and rejection reason;
- `sessions`: impression id -> the impression, when it was accepted, the documents clicked
  and whether its clicks are final;
- `held`: impression id -> the clicks waiting for it, each with its serial number;
- `ranks`: bucket -> [shown by rank, clicked by rank];
- `pairs`: (bucket, (query, document)) -> [impressions, clicks, examinations, last clicks,
  [[rank, impressions], ...]];
- `graded`: (query, document) -> [grade, boundary, {evidence}]: the judgment last emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Pair = tuple[str, str]
PairKey = tuple[int, Pair]


@dataclass
class JudgeState:
    """A judge's state, whole (`ClickJudge.state`), or its changes (`ClickJudge.changes`: a value
    None is a removal, and `forgotten` the buckets of pair counts dropped before the rest is written)."""

    meta: dict[str, Any] = field(default_factory=dict)
    sessions: dict[str, list[Any] | None] = field(default_factory=dict)
    held: dict[str, list[Any] | None] = field(default_factory=dict)
    ranks: dict[int, list[list[int]] | None] = field(default_factory=dict)
    pairs: dict[PairKey, list[Any] | None] = field(default_factory=dict)
    graded: dict[Pair, list[Any] | None] = field(default_factory=dict)
    forgotten: set[int] = field(default_factory=set)

    @property
    def empty(self) -> bool:
        """Nothing but the scalars: no section changed."""
        return not (self.sessions or self.held or self.ranks or self.pairs or self.graded or self.forgotten)


def merged(stored: JudgeState, changes: JudgeState) -> JudgeState:
    """`stored` with `changes` applied, as a store applies a commit's: forgotten buckets first,
    then every value written or removed; `stored` is left as it was."""
    result = JudgeState(meta={**stored.meta, **changes.meta}, sessions=dict(stored.sessions), held=dict(stored.held),
                        ranks=dict(stored.ranks), graded=dict(stored.graded),
                        pairs={key: value for key, value in stored.pairs.items() if key[0] not in changes.forgotten})
    sections: tuple[tuple[dict[Any, Any], dict[Any, Any]], ...] = (
        (result.sessions, changes.sessions), (result.held, changes.held), (result.ranks, changes.ranks),
        (result.pairs, changes.pairs), (result.graded, changes.graded))
    for section, changed in sections:
        for key, value in changed.items():
            if value is None:
                section.pop(key, None)
            else:
                section[key] = value
    return result
