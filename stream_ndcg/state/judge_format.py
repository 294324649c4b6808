"""The stored form of a click judge's state: `click_state.JudgeState` as hashes of short fields.

Both judge stores keep a partition's judge state in this form: Redis as hashes under the
partition's key prefix (`state.judge_redis`), the in-memory store as the same mappings. The
hashes, by their name after the prefix:

    meta            clock (the judge's clock, ms), closed (the last boundary closed), boundaries,
                    emitted (judgments), changed (1: counts changed since the last boundary
                    emitted), serial (of the last click held), counts (JSON: events by type,
                    duplicate and rejection reason); beside them the store's own fields
                    (offset, epoch-checked by the commit script)
    sessions        impression id -> JSON [query, ts, results, segment, event id, accepted at,
                    documents clicked, final]
    held            impression id -> JSON [[serial, query, document, ts, event id], ...]
    ranks           bucket -> shown by rank, comma-separated, '|', clicked by rank
    pairs:<bucket>  JSON [query, document] -> impressions,clicks,examinations,last clicks|
                    rank:impressions,... (one hash per bucket, dropped whole when the horizon
                    passes it)
    graded          JSON [query, document] -> JSON [grade, boundary, {evidence}]: the judgment
                    last emitted for the pair (`ts` = boundary), so that it can be read back
                    (`stream-ndcg judgments export`, the drill-down) as it was published

`JUDGE_FORMAT_VERSION` numbers this layout; a store records it with the state and refuses
another (`check_judge_format`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from stream_ndcg.click_state import JudgeState, Pair
from stream_ndcg.errors import ConfigError

# Bump it with any change to the layout above.
JUDGE_FORMAT_VERSION = 2
META_FIELDS = ("clock", "closed", "boundaries", "emitted", "changed", "serial", "counts")
PAIRS = "pairs:"

Hashes = Mapping[str, Mapping[Any, Any]]


def check_judge_format(found: str | None) -> None:
    """Refuse judge state recorded in another format version (None: nothing recorded yet)."""
    if found is not None and found != str(JUDGE_FORMAT_VERSION):
        raise ConfigError(f"the judge's stored state is in format version {found!r}, and this release reads "
                          f"version {JUDGE_FORMAT_VERSION} only: run a release that reads it, or use another "
                          "namespace")


@dataclass
class HashWrites:
    """What a commit does to a partition's hashes: fields set, fields removed, hashes dropped
    whole (first)."""

    set: dict[str, dict[str, str]] = field(default_factory=dict)
    removed: dict[str, list[str]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def put(self, name: str, key: str, value: str | None) -> None:
        if value is None:
            self.removed.setdefault(name, []).append(key)
        else:
            self.set.setdefault(name, {})[key] = value


def pair_field(pair: Pair) -> str:
    return orjson.dumps(list(pair)).decode()


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _number(value: int | None) -> str:
    return "" if value is None else str(value)


def writes(state: JudgeState) -> HashWrites:
    """The hash writes of a state's changes (`ClickJudge.changes`), or of a whole state."""
    out = HashWrites(dropped=[f"{PAIRS}{bucket}" for bucket in sorted(state.forgotten)])
    meta = state.meta
    if meta:
        out.set["meta"] = {"clock": _number(meta["clock_ms"]), "closed": _number(meta["closed"]),
                           "boundaries": str(meta["boundaries"]), "emitted": str(meta["emitted"]),
                           "changed": "1" if meta["changed"] else "0", "serial": str(meta["serial"]),
                           "counts": _json(dict(sorted(meta["counts"].items())))}
    for impression_id, session in state.sessions.items():
        out.put("sessions", impression_id, None if session is None else _json(session))
    for impression_id, held in state.held.items():
        out.put("held", impression_id, None if held is None else _json(held))
    for bucket, ranks in state.ranks.items():
        out.put("ranks", str(bucket), None if ranks is None else
                f"{','.join(map(str, ranks[0]))}|{','.join(map(str, ranks[1]))}")
    for (bucket, pair), counts in state.pairs.items():
        out.put(f"{PAIRS}{bucket}", pair_field(pair), None if counts is None else
                f"{counts[0]},{counts[1]},{counts[2]},{counts[3]}|{','.join(f'{r}:{n}' for r, n in counts[4])}")
    for pair, graded in state.graded.items():
        out.put("graded", pair_field(pair), None if graded is None else _json(graded))
    return out


def fields_of_state(state: JudgeState) -> dict[str, dict[str, str]]:
    """A whole state as hashes (name -> fields)."""
    return writes(state).set


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(value: str) -> int | None:
    return int(value) if value else None


def state_of_fields(hashes: Hashes) -> JudgeState:
    """The state that `fields_of_state` wrote (hashes as Redis gives them: bytes or text); an
    empty mapping is a judge that has taken nothing in."""
    state = JudgeState()
    meta = {_text(k): _text(v) for k, v in hashes.get("meta", {}).items()}
    if "clock" in meta:
        state.meta = {"clock_ms": _optional(meta["clock"]), "closed": _optional(meta["closed"]),
                      "boundaries": int(meta["boundaries"]), "emitted": int(meta["emitted"]),
                      "changed": meta["changed"] == "1", "serial": int(meta["serial"]),
                      "counts": orjson.loads(meta["counts"])}
    state.sessions = {_text(k): orjson.loads(v) for k, v in hashes.get("sessions", {}).items()}
    state.held = {_text(k): orjson.loads(v) for k, v in hashes.get("held", {}).items()}
    for key, value in hashes.get("ranks", {}).items():
        shown, clicked = _text(value).split("|")
        state.ranks[int(_text(key))] = [[int(n) for n in shown.split(",")], [int(n) for n in clicked.split(",")]]
    for name, fields in hashes.items():
        if not name.startswith(PAIRS):
            continue
        bucket = int(name[len(PAIRS):])
        for key, value in fields.items():
            counts, _, ranks = _text(value).partition("|")
            impressions, clicks, examinations, last_clicks = (int(n) for n in counts.split(","))
            by_rank = [[int(r), int(n)] for r, n in (item.split(":") for item in ranks.split(",") if item)]
            query, doc = orjson.loads(key)
            state.pairs[(bucket, (query, doc))] = [impressions, clicks, examinations, last_clicks, by_rank]
    state.graded.update(graded_of_fields(hashes.get("graded", {})))
    return state


def graded_of_fields(fields: Mapping[Any, Any]) -> dict[Pair, list[Any]]:
    """The `graded` hash's pairs, each [grade, boundary, {evidence}] (fields as Redis gives them:
    bytes or text)."""
    graded: dict[Pair, list[Any]] = {}
    for key, value in fields.items():
        query, doc = orjson.loads(key)
        grade, boundary, evidence = orjson.loads(value)
        graded[(query, doc)] = [float(grade), boundary, evidence]
    return graded
