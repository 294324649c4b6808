"""A drill-down request's parameters, checked: what every route of the API and `stream-ndcg
judging-queue` asks.

`Question.parse` turns query-string parameters into a `Question`, and refuses a bad one with a
`BadParameter` that names the parameter, so the explorer answers only questions it can.

    Question.parse({"window": ["1h"], "k": ["10"], "segment.variant": ["B"]}, view)
    Question.parse({"window": ["1h"], "control": ["variant:A"]}, view)   # the summary's comparisons
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stream_ndcg.drilldown import index
from stream_ndcg.errors import BadParameter
from stream_ndcg.exporter import WindowView
from stream_ndcg.setting_values import Bad, duration, format_duration

# The rows one answer holds by default and at most (a query's distinct lists for "query"), and the
# longest query id asked for (the event contract's).
DEFAULT_LIMIT = {"queries": 50, "judging-queue": 100, "query": 200}
MAX_LIMIT = {"queries": 1000, "judging-queue": 10_000, "query": 1000}
MAX_QUERY_ID = 512
_ORDERS = ("asc", "desc")
_FORMATS = ("json", "jsonl", "csv")
_KNOWN = {"window", "k", "sort", "order", "limit", "offset", "min_impressions", "vs", "format", "control"}


@dataclass(frozen=True)
class Question:
    """A checked drill-down request."""

    window_ms: int
    k: int
    segment: dict[str, str] = field(default_factory=dict)
    # None, "previous", or (label, value): another value of one segment label.
    vs: str | tuple[str, str] | None = None
    # (label, value): what the summary compares every other value of the label with.
    control: tuple[str, str] | None = None
    sort: str = "ndcg"
    descending: bool = False
    limit: int = 50
    offset: int = 0
    min_impressions: int = 1
    format: str = "json"

    @classmethod
    def parse(cls, params: Mapping[str, Sequence[str]], view: WindowView, kind: str = "queries") -> Question:
        """From query-string parameters (each a list of values, as `urllib.parse.parse_qs` gives)."""
        def one(name: str, default: str) -> str:
            values = params.get(name)
            if not values:
                return default
            if len(values) > 1:
                raise BadParameter(name, "given more than once")
            return values[0]

        for name in params:
            if name not in _KNOWN and not name.startswith("segment."):
                raise BadParameter(name, f"unknown parameter (known: {', '.join(sorted(_KNOWN))}, segment.<label>)")
        windows = {format_duration(w): w for w in view.windows_ms}
        window_text = one("window", format_duration(view.windows_ms[0]))
        try:
            window_ms = duration(1)(window_text)
        except Bad:
            window_ms = -1
        if window_ms not in view.windows_ms:
            raise BadParameter("window", f"{window_text!r} is not a configured window ({', '.join(windows)})")
        k = _integer("k", one("k", str(view.cutoffs[-1])), 1)
        if k not in view.cutoffs:
            raise BadParameter("k", f"{k} is not a configured cut-off ({', '.join(map(str, view.cutoffs))})")
        segment = {}
        for name in params:
            if name.startswith("segment."):
                label = name.removeprefix("segment.")
                if label not in view.segment_labels:
                    raise BadParameter(name, f"{label!r} is not a segment label "
                                             f"({', '.join(view.segment_labels) or 'none configured'})")
                segment[label] = one(name, "")
        vs = _comparison(one("vs", ""), view)
        control = _comparison(one("control", ""), view, "control")
        if control == "previous":
            raise BadParameter("control", "use <label>:<value> with a segment label")
        sort = one("sort", "ndcg")
        if sort not in index.SORTS:
            raise BadParameter("sort", f"{sort!r} is not a column ({', '.join(index.SORTS)})")
        if sort.startswith("change_") and vs is None:
            raise BadParameter("sort", f"{sort!r} needs a comparison: add vs=previous or vs=<label>:<value>")
        order = one("order", "asc")
        if order not in _ORDERS:
            raise BadParameter("order", f"{order!r} is not asc or desc")
        cap = MAX_LIMIT[kind]
        limit = _integer("limit", one("limit", str(DEFAULT_LIMIT[kind])), 1, cap)
        form = one("format", "json")
        if form not in _FORMATS:
            raise BadParameter("format", f"{form!r} is not one of {', '.join(_FORMATS)}")
        return cls(window_ms=window_ms, k=k, segment=segment, vs=vs,
                   control=control if isinstance(control, tuple) else None, sort=sort, descending=order == "desc",
                   limit=limit, offset=_integer("offset", one("offset", "0"), 0),
                   min_impressions=_integer("min_impressions", one("min_impressions", "1"), 0), format=form)


def _integer(name: str, text: str, least: int, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadParameter(name, f"{text[:40]!r} is not a whole number") from None
    if value < least or (most is not None and value > most):
        raise BadParameter(name, f"{value} is out of range: {least} to {most}" if most is not None
                           else f"{value} is out of range: at least {least}")
    return value


def _comparison(text: str, view: WindowView, name: str = "vs") -> str | tuple[str, str] | None:
    if not text:
        return None
    if text == "previous":
        return text
    label, sep, value = text.partition(":")
    if not sep or label not in view.segment_labels:
        raise BadParameter(name, f"{text[:80]!r}: use previous or <label>:<value> with a segment label "
                                 f"({', '.join(view.segment_labels) or 'none configured'})")
    return label, value


def check_query_id(query_id: str) -> str:
    if not query_id or len(query_id) > MAX_QUERY_ID:
        raise BadParameter("query_id", f"must be 1 to {MAX_QUERY_ID} characters, not {len(query_id)}")
    return query_id
