"""OpenSearch UBI (user behavior insights, schema 1.3.0) documents to the event contract.

UBI keys everything by the search (`query_id`), and its click events do not carry the query
text, which our contract keys by. A `UbiJoin` takes the UBI documents of one partition pair
(the queries topic's partition p and the events topic's partition p, both keyed by UBI
`query_id`), joins each click to its search, and returns our impressions and clicks:

- a UBI query (`query_id`, `user_query`, `query_response_hit_ids`, `timestamp`) is an impression
  whose `impression_id` is the UBI `query_id` and whose `query_id` is the `user_query`; its
  `query_attributes`' string values are the segment;
- without `query_response_hit_ids`, the impression is assembled from the UBI `impression` events
  of that search: those stamped up to `impression_wait_ms` after the search, ordered by
  `position.ordinal` (then time, then id); it is complete, and emitted, once the clock passes
  that bound;
- a UBI event with `action_name` `click` and `event_attributes.object.object_id` is a click on
  that document of that impression; a click whose search has not arrived waits `click_wait_ms`
  past its own time, then counts as unjoined and is dropped; a click stamped more than
  `search_ttl_ms` after its search is too late (the search is forgotten then);
- everything else is counted by reason (`SKIP_REASONS`) and skipped.

The clock is the older of the newest UBI timestamps read of each topic, so the outcome depends on
the documents, not on when they are read, nor on one topic being read ahead of the other: within
those bounds, the order in which a search and its events arrive changes nothing. Event ids are
derived from the documents (the search's id; a digest of the click document), so a document read
twice gives the same event twice, which the contract's consumers count once.

    join = UbiJoin(UbiOptions())
    events = join.add_query(b'{"query_id": "q1", "user_query": "tv", ...}', offset=0)
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

from stream_ndcg.events import DEFAULT_LIMITS, MAX_TS_MS, Click, Impression, Limits

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)

SKIP_REASONS = (
    "not_json", "not_object", "missing_query_id", "invalid_query_id", "missing_user_query", "invalid_user_query",
    "missing_timestamp", "invalid_timestamp", "invalid_hit_ids", "missing_action_name", "other_action",
    "missing_object", "invalid_object_id", "excluded_client", "duplicate_search", "no_results",
    "impression_with_hit_ids", "late_impression", "no_search",
    # An event the bridge's output topic refused for its size (counted by the bridge, not the join).
    "too_large",
)
CLICK_OUTCOMES = ("joined", "unjoined", "too_late")


class Skip(Exception):
    """A UBI document that becomes no event; `reason` is one of `SKIP_REASONS`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class UbiOptions:
    """The bounds of a join (durations in milliseconds) and the clients it leaves out."""

    click_wait_ms: int = 600_000
    search_ttl_ms: int = 1_800_000
    impression_wait_ms: int = 60_000
    # Glob patterns (fnmatch, case-sensitive) of `client_id`s whose searches and events are skipped.
    excluded_clients: tuple[str, ...] = ()
    limits: Limits = DEFAULT_LIMITS

    def excluded(self, client_id: Any) -> bool:
        return isinstance(client_id, str) and any(fnmatchcase(client_id, p) for p in self.excluded_clients)


@dataclass
class UbiCounts:
    """What the joins of a process read and did: documents read by kind, skipped by reason, clicks by
    outcome, impressions emitted. Shared by every join of the process (the metrics read it)."""

    read: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    clicks: Counter[str] = field(default_factory=Counter)
    impressions: int = 0


def ubi_timestamp(value: Any) -> int:
    """Epoch milliseconds of a UBI `timestamp`: ISO 8601 (no offset: UTC, as the schema's own example
    `2018-11-13T20:20:39`), or integer epoch milliseconds, as OpenSearch's UBI plugin stores it."""
    if value is None:
        raise Skip("missing_timestamp")
    if type(value) is int:
        ms = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise Skip("invalid_timestamp") from None
        ms = (moment.replace(tzinfo=moment.tzinfo or UTC) - _EPOCH) // _MILLISECOND
    else:
        raise Skip("invalid_timestamp")
    if not 0 <= ms <= MAX_TS_MS:
        raise Skip("invalid_timestamp")
    return ms


def _document(raw: bytes | str | None) -> dict[str, Any]:
    if raw is None:
        raise Skip("not_json")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise Skip("not_json") from None
    if not isinstance(obj, dict):
        raise Skip("not_object")
    return obj


def _identifier(obj: dict[str, Any], name: str, limits: Limits) -> str:
    value = obj.get(name)
    if value is None:
        raise Skip(f"missing_{name}")
    if not isinstance(value, str) or not value or len(value) > limits.max_id_length:
        raise Skip(f"invalid_{name}")
    return value


@dataclass
class _Search:
    """A search (UBI query) remembered for the clicks made on it."""

    offset: int
    ts: int
    query: str
    segment: tuple[tuple[str, str], ...]
    # Why its clicks are skipped (its client is excluded, or it showed nothing), if they are.
    skip: str | None
    # None while the impression is being assembled from impression events.
    results: tuple[str, ...] | None
    from_hits: bool


@dataclass(frozen=True)
class _Held:
    """A click waiting for its search, or for its search's impression to be assembled."""

    ubi_query_id: str
    doc_id: str
    ts: int
    event_id: str


# What a deadline of the clock is for, in the order they are handled at the same instant.
_ASSEMBLE, _GIVE_UP_CLICK, _GIVE_UP_SHOWN, _FORGET = range(4)


class UbiJoin:
    """Joins the UBI documents of one partition pair into contract events (see the module docstring).

    `low_water()` gives, per input topic, the least offset of a document still held (a search that
    clicks may still come for, a waiting click, an impression event not yet assembled): committing
    there and reading again from it after a restart rebuilds what was held.
    """

    def __init__(self, options: UbiOptions, counts: UbiCounts | None = None) -> None:
        self.options = options
        self.counts = counts if counts is not None else UbiCounts()
        # The newest timestamp read of each topic; the join's clock is the older of the two.
        self.query_clock = self.event_clock = -1
        # Each in arrival order, that is in offset order, so that its first entry holds its least offset.
        self._searches: dict[str, _Search] = {}
        self._held: dict[int, _Held] = {}
        self._shown: dict[str, dict[int, tuple[int, int, str]]] = {}
        self._waiting: dict[str, list[int]] = {}
        # (deadline, what for, UBI query id, offset of a held click or -1): a heap.
        self._deadlines: list[tuple[int, int, str, int]] = []

    def low_water(self) -> tuple[int | None, int | None]:
        """The least offset still held of the queries topic, and of the events topic (None: none)."""
        queries = next(iter(self._searches.values())).offset if self._searches else None
        firsts = [offset for offset in (next(iter(self._held), None),
                                        next((next(iter(s)) for s in self._shown.values()), None))
                  if offset is not None]
        return queries, min(firsts) if firsts else None

    def add_query(self, raw: bytes | str | None, offset: int) -> list[Impression | Click]:
        """A document of the queries topic: the events it completes, then those the clock releases."""
        self.counts.read["query"] += 1
        out: list[Impression | Click] = []
        try:
            self._query(_document(raw), offset, out)
        except Skip as skip:
            self.counts.skipped[skip.reason] += 1
        self._advance(out)
        return out

    def add_event(self, raw: bytes | str | None, offset: int) -> list[Impression | Click]:
        """A document of the events topic: the click it joins, then what the clock releases."""
        self.counts.read["event"] += 1
        out: list[Impression | Click] = []
        try:
            self._event(_document(raw), offset, out)
        except Skip as skip:
            self.counts.skipped[skip.reason] += 1
        self._advance(out)
        return out

    def _query(self, obj: dict[str, Any], offset: int, out: list[Impression | Click]) -> None:
        limits = self.options.limits
        ubi_query_id = _identifier(obj, "query_id", limits)
        ts = ubi_timestamp(obj.get("timestamp"))
        self.query_clock = max(self.query_clock, ts)
        if ubi_query_id in self._searches:
            raise Skip("duplicate_search")
        excluded = self.options.excluded(obj.get("client_id"))
        query = obj.get("user_query")
        if not excluded and query is None:
            raise Skip("missing_user_query")
        if not excluded and (not isinstance(query, str) or not query or len(query) > limits.max_id_length):
            raise Skip("invalid_user_query")
        hits = obj.get("query_response_hit_ids")
        if hits is not None and (not isinstance(hits, list) or not all(isinstance(h, str) and h for h in hits)):
            raise Skip("invalid_hit_ids")
        search = _Search(offset, ts, query if isinstance(query, str) else "", _segment(obj, limits),
                         "excluded_client" if excluded else None, None if hits is None else _results(hits, limits),
                         hits is not None)
        self._searches[ubi_query_id] = search
        self._due(ts + self.options.search_ttl_ms, _FORGET, ubi_query_id)
        if excluded:
            self.counts.skipped["excluded_client"] += 1
            self._drop_shown(ubi_query_id, "excluded_client")
            self._release(ubi_query_id, search, out)
        elif search.results is not None:
            self._drop_shown(ubi_query_id, "impression_with_hit_ids")
            self._emit(ubi_query_id, search, search.results, out)
        else:
            self._due(ts + self.options.impression_wait_ms, _ASSEMBLE, ubi_query_id)

    def _event(self, obj: dict[str, Any], offset: int, out: list[Impression | Click]) -> None:
        ts = ubi_timestamp(obj.get("timestamp"))
        self.event_clock = max(self.event_clock, ts)
        action = obj.get("action_name")
        if action is None:
            raise Skip("missing_action_name")
        if action not in ("click", "impression"):
            raise Skip("other_action")
        ubi_query_id = _identifier(obj, "query_id", self.options.limits)
        attributes = obj.get("event_attributes")
        thing = attributes.get("object") if isinstance(attributes, dict) else None
        if not isinstance(thing, dict) or thing.get("object_id") is None:
            raise Skip("missing_object")
        doc_id = thing["object_id"]
        if type(doc_id) is int:
            doc_id = str(doc_id)
        if not isinstance(doc_id, str) or not doc_id or len(doc_id) > self.options.limits.max_id_length:
            raise Skip("invalid_object_id")
        search = self._searches.get(ubi_query_id)
        if self.options.excluded(obj.get("client_id")):
            raise Skip("excluded_client")
        if search is not None and search.skip is not None:
            raise Skip(search.skip)
        if action == "impression":
            if search is not None and search.results is not None:
                raise Skip("impression_with_hit_ids" if search.from_hits else "late_impression")
            position = attributes.get("position") if isinstance(attributes, dict) else None
            ordinal = position.get("ordinal") if isinstance(position, dict) else None
            # Shown without an ordinal: after every ordinal, in time order.
            rank = ordinal if type(ordinal) is int else MAX_TS_MS
            self._shown.setdefault(ubi_query_id, {})[offset] = (rank, ts, doc_id)
            self._due(ts + self.options.click_wait_ms, _GIVE_UP_SHOWN, ubi_query_id)
            return
        if offset in self._held:
            return
        self._held[offset] = _Held(ubi_query_id, doc_id, ts, "ubi-" + _digest(obj))
        self._waiting.setdefault(ubi_query_id, []).append(offset)
        if search is not None and search.results is not None:
            self._release(ubi_query_id, search, out)
        else:
            self._due(ts + self.options.click_wait_ms, _GIVE_UP_CLICK, ubi_query_id, offset)

    @property
    def clock(self) -> int:
        """The time both topics have reached: reading one ahead of the other (a backlog of one) gives up
        on nothing early."""
        return min(self.query_clock, self.event_clock)

    def _due(self, deadline: int, what: int, ubi_query_id: str, offset: int = -1) -> None:
        heapq.heappush(self._deadlines, (deadline, what, ubi_query_id, offset))

    def _advance(self, out: list[Impression | Click]) -> None:
        """What the clock completes or gives up: assembled impressions whose wait is over (with their
        clicks), clicks and impression events that waited long enough for their search, searches past
        their ttl. Each deadline is checked against what is still held when it comes."""
        clock = self.clock
        while self._deadlines and self._deadlines[0][0] < clock:
            _, what, ubi_query_id, offset = heapq.heappop(self._deadlines)
            search = self._searches.get(ubi_query_id)
            if what == _ASSEMBLE and search is not None and search.results is None and search.skip is None:
                self._assemble(ubi_query_id, search, out)
            elif what == _GIVE_UP_CLICK and search is None and offset in self._held:
                del self._held[offset]
                self._waiting[ubi_query_id].remove(offset)
                if not self._waiting[ubi_query_id]:
                    del self._waiting[ubi_query_id]
                self.counts.clicks["unjoined"] += 1
            elif what == _GIVE_UP_SHOWN and search is None and ubi_query_id in self._shown and all(
                    clock > ts + self.options.click_wait_ms for _, ts, _ in self._shown[ubi_query_id].values()):
                self._drop_shown(ubi_query_id, "no_search")
            elif what == _FORGET and search is not None:
                del self._searches[ubi_query_id]

    def _assemble(self, ubi_query_id: str, search: _Search, out: list[Impression | Click]) -> None:
        """The impression of a search without hit ids, from the impression events stamped within its wait."""
        bound = search.ts + self.options.impression_wait_ms
        shown = self._shown.pop(ubi_query_id, {})
        kept = sorted(entry for entry in shown.values() if entry[1] <= bound)
        self._skip("late_impression", len(shown) - len(kept))
        if not kept:
            self.counts.skipped["no_results"] += 1
            search.skip = "no_results"
            self._release(ubi_query_id, search, out)
            return
        search.results = _results([doc for _, _, doc in kept], self.options.limits)
        self._emit(ubi_query_id, search, search.results, out)

    def _emit(self, ubi_query_id: str, search: _Search, results: tuple[str, ...],
              out: list[Impression | Click]) -> None:
        out.append(Impression(ubi_query_id, search.query, search.ts, results, search.segment, f"ubi-{ubi_query_id}"))
        self.counts.impressions += 1
        self._release(ubi_query_id, search, out)

    def _release(self, ubi_query_id: str, search: _Search, out: list[Impression | Click]) -> None:
        """The held clicks of a search whose impression is known (or that gives none): joined, too late
        or skipped."""
        for offset in self._waiting.pop(ubi_query_id, []):
            held = self._held.pop(offset)
            if search.skip is not None:
                self.counts.skipped[search.skip] += 1
            elif held.ts > search.ts + self.options.search_ttl_ms:
                self.counts.clicks["too_late"] += 1
            else:
                self.counts.clicks["joined"] += 1
                out.append(Click(ubi_query_id, search.query, held.doc_id, held.ts, held.event_id))

    def _drop_shown(self, ubi_query_id: str, reason: str) -> None:
        self._skip(reason, len(self._shown.pop(ubi_query_id, {})))

    def _skip(self, reason: str, count: int) -> None:
        if count:
            self.counts.skipped[reason] += count


def _results(hits: list[str], limits: Limits) -> tuple[str, ...]:
    """The ranked results of a search: ids longer than the contract's are cut out, and only the first
    `max_results` are kept (the top of a list is what the metric reads)."""
    return tuple(hit for hit in hits if len(hit) <= limits.max_id_length)[:limits.max_results]


def _segment(obj: dict[str, Any], limits: Limits) -> tuple[tuple[str, str], ...]:
    """The string values of `query_attributes` (by key order, at most `max_segment_keys`); other
    values (filters as objects, page numbers) are not segments."""
    attributes = obj.get("query_attributes")
    if not isinstance(attributes, dict):
        return ()
    pairs = sorted((key, value) for key, value in attributes.items()
                   if isinstance(value, str) and 0 < len(key) <= limits.max_id_length
                   and len(value) <= limits.max_id_length)
    return tuple(pairs[:limits.max_segment_keys])


def _digest(obj: dict[str, Any]) -> str:
    """A digest of the document's content, the same however its keys were ordered or spaced."""
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def contract_message(event: Impression | Click) -> tuple[bytes, bytes]:
    """The Kafka key (the query text) and value (one JSON object) of an event of the contract."""
    if isinstance(event, Impression):
        body: dict[str, Any] = {"type": "impression", "impression_id": event.impression_id,
                                "query_id": event.query_id, "ts": event.ts, "results": list(event.results)}
        if event.segment:
            body["segment"] = dict(event.segment)
    else:
        body = {"type": "click", "impression_id": event.impression_id, "query_id": event.query_id,
                "doc_id": event.doc_id, "ts": event.ts}
    body["event_id"] = event.event_id
    return event.query_id.encode(), json.dumps(body, ensure_ascii=False).encode()
