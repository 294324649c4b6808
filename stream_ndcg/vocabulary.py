"""The names of stream-ndcg: aggregate fields, event counts, segment keys and Prometheus metrics.

Standard library only. Every module that writes or reads one of these names
takes it from here (arroyo's ``utils/metric_defs.py`` is the pattern), so the
engine, the stores, the exporter, the demo and the benchmarks cannot drift
apart. The aggregate fields, count keys and segment keys are stored in Redis
and the metric names are scraped by dashboards and alerts: changing a spelling
here is a data migration (see `state_format.FORMAT_VERSION`) or a breaking
change of the exposition, not a refactor.

    >>> dcg_at(10), duplicate(IMPRESSION), rejection_reason(rejected("not_json"))
    ('dcg@10', 'duplicate:impression', 'not_json')
"""

from __future__ import annotations

import functools
import json
import re
from typing import Final

# (time bucket, segment key, aggregate field) -> sum.
AggregateKey = tuple[int, str, str]
Segment = tuple[tuple[str, str], ...]

# Aggregate fields, summed per (bucket, segment) over impressions.
IMPRESSIONS: Final = "impressions"


def dcg_at(k: int) -> str:
    """The sum of DCG@k."""
    return f"dcg@{k}"


def ndcg_at(k: int) -> str:
    """The sum of nDCG@k over the impressions where it is defined."""
    return f"ndcg@{k}"


def scored_at(k: int) -> str:
    """How many impressions have a defined nDCG@k (ideal DCG > 0)."""
    return f"scored@{k}"


def judged_at(k: int) -> str:
    """The sum of the judged ratio@k."""
    return f"judged@{k}"


def dcg_squares_at(k: int) -> str:
    """The sum of squares of DCG@k, over the impressions `dcg_at` sums: with it the variance."""
    return f"dcg_sq@{k}"


def ndcg_squares_at(k: int) -> str:
    """The sum of squares of nDCG@k, over the impressions `ndcg_at` sums."""
    return f"ndcg_sq@{k}"


# How many impressions the sums of squares hold: all of them, but for groups stored in state
# format 4 or earlier and not re-credited since (`state.format`), whose squares are unknown.
MOMENTS: Final = "moments"


def exposure_at(k: int) -> str:
    """The sum of the top-k exposure, 1 / log2(rank + 1) per distinct document at rank <= k
    (drill-down rows only: what the judging queue shares out)."""
    return f"exposure@{k}"


def unjudged_at(k: int) -> str:
    """The part of `exposure_at` held by documents without a grade (drill-down rows only)."""
    return f"unjudged@{k}"


def unjudged_top_at(k: int) -> str:
    """The `exposure_at` of the one unjudged document that holds the most of it in a group of
    impressions (drill-down rows only): summed over groups, it bounds any single document's."""
    return f"unjudged_top@{k}"


# Event counts: accepted events by type, and the ones ignored or refused.
IMPRESSION: Final = "impression"
JUDGMENT: Final = "judgment"
CLICK: Final = "click"
EVENT_TYPES: Final = (IMPRESSION, JUDGMENT, CLICK)
# The types `run` finds duplicates of: it counts a click and sets it aside, so one topic can carry
# all three types (the click models find duplicate clicks: `click_sessions`).
DEDUPLICATED_TYPES: Final = (IMPRESSION, JUDGMENT)
# The one rejection the engine makes itself (the contract's reasons are in `events`): an event
# older than the horizon (impressions) or the judgment TTL (judgments).
TOO_OLD: Final = "too_old"
# The rejections of a click by the click models (`click_sessions`): its impression never came, did
# not show the document, was of another query, or its clicks were final already.
UNKNOWN_IMPRESSION: Final = "unknown_impression"
NOT_SHOWN: Final = "not_shown"
QUERY_MISMATCH: Final = "query_mismatch"
AFTER_SESSION: Final = "after_session"
_DUPLICATE = "duplicate:"
_REJECTED = "rejected:"
_JUDGMENT_SOURCE = "judgment_source:"
# Judgment events of a source that `judgment_sources` does not list: counted, never applied (a
# pipeline on the same topic may use them), without their source as a label so that no producer
# can make the series unbounded.
UNLISTED_SOURCE: Final = "judgment_unlisted_source"

# Who graded a judgment event (its `source` field): people unless it says otherwise, and the
# click models by their names (`click_models`). A name is a Prometheus label value and a stored
# word: 1 to 32 characters, lowercase ASCII letters, digits, '_' and '-', a letter first.
RATERS: Final = "raters"
DEFAULT_JUDGMENT_SOURCES: Final = (RATERS, "coec", "sdbn")
SOURCE_NAME: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")
SOURCE_RULE: Final = "1 to 32 characters of lowercase ASCII letters, digits, '_' and '-', a letter first"


def duplicate(event_type: str) -> str:
    """The count of events of `event_type` delivered again and ignored."""
    return _DUPLICATE + event_type


def rejected(reason: str) -> str:
    """The count of events refused for `reason`."""
    return _REJECTED + reason


def rejection_reason(count_key: str) -> str | None:
    """The reason of a `rejected` count key; None for any other key."""
    return count_key.removeprefix(_REJECTED) if count_key.startswith(_REJECTED) else None


def judgment_from(source: str) -> str:
    """The count of judgment events of `source` applied (besides their count as a `JUDGMENT`)."""
    return _JUDGMENT_SOURCE + source


def judgment_source(count_key: str) -> str | None:
    """The source of a `judgment_from` count key; None for any other key."""
    return count_key.removeprefix(_JUDGMENT_SOURCE) if count_key.startswith(_JUDGMENT_SOURCE) else None


# Segment values that no impression can claim: a label the impression lacks,
# and a value past the cap of distinct values per label.
MISSING: Final = "none"
OVERFLOW: Final = "other"


@functools.lru_cache(maxsize=4096)
def full_segment_key(segment: Segment) -> str:
    """The segment key of the whole segment map (the replay's and the tests' grouping)."""
    return json.dumps(dict(segment), sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def parse_segment_key(segment_key: str) -> dict[str, str]:
    """The segment map a segment key was made of (`full_segment_key`), values as text. Cached:
    the result is shared, never change it."""
    return {str(k): str(v) for k, v in json.loads(segment_key).items()} if segment_key else {}


def segment_values(segment_key: str, labels: tuple[str, ...]) -> list[str]:
    """The values of `labels` in a segment key, MISSING where the key has none."""
    segment = parse_segment_key(segment_key)
    return [segment.get(label, MISSING) for label in labels]


class MetricName:
    """Every Prometheus metric the service exports. Counters are named without the ``_total``
    their samples carry (`total` adds it), as prometheus_client declares them."""

    PREFIX: Final = "stream_ndcg"
    # Read from the shared state at scrape time.
    EVENTS: Final = f"{PREFIX}_events"
    EVENTS_REJECTED: Final = f"{PREFIX}_events_rejected"
    EVENTS_DUPLICATE: Final = f"{PREFIX}_events_duplicate"
    JUDGMENTS: Final = f"{PREFIX}_judgments"
    JUDGMENTS_UNLISTED: Final = f"{PREFIX}_judgments_unlisted_source"
    NDCG: Final = f"{PREFIX}_ndcg"
    NDCG_NUMERATOR: Final = f"{PREFIX}_ndcg_numerator"
    SCORED_IMPRESSIONS: Final = f"{PREFIX}_scored_impressions"
    DCG: Final = f"{PREFIX}_dcg"
    DCG_NUMERATOR: Final = f"{PREFIX}_dcg_numerator"
    JUDGED_RATIO: Final = f"{PREFIX}_judged_ratio"
    JUDGED_RATIO_NUMERATOR: Final = f"{PREFIX}_judged_ratio_numerator"
    IMPRESSIONS: Final = f"{PREFIX}_impressions"
    NDCG_SQUARES: Final = f"{PREFIX}_ndcg_squares"
    DCG_SQUARES: Final = f"{PREFIX}_dcg_squares"
    SQUARED_IMPRESSIONS: Final = f"{PREFIX}_squared_impressions"
    NDCG_STANDARD_ERROR: Final = f"{PREFIX}_ndcg_standard_error"
    DCG_STANDARD_ERROR: Final = f"{PREFIX}_dcg_standard_error"
    # From the drill-down's per-query sums: exported with drilldown = true only.
    NDCG_CLUSTERED_STANDARD_ERROR: Final = f"{PREFIX}_ndcg_clustered_standard_error"
    DCG_CLUSTERED_STANDARD_ERROR: Final = f"{PREFIX}_dcg_clustered_standard_error"
    NDCG_QUERY_MEAN: Final = f"{PREFIX}_ndcg_query_mean"
    QUERIES: Final = f"{PREFIX}_queries"
    QUERY_FIGURES_TIMESTAMP: Final = f"{PREFIX}_query_figures_timestamp_seconds"
    # `judge`'s, read from its shared state at scrape time.
    JUDGE_EVENTS: Final = f"{PREFIX}_judge_events"
    JUDGE_EVENTS_REJECTED: Final = f"{PREFIX}_judge_events_rejected"
    JUDGE_EVENTS_DUPLICATE: Final = f"{PREFIX}_judge_events_duplicate"
    JUDGE_GRADED_PAIRS: Final = f"{PREFIX}_judge_graded_pairs"
    JUDGE_CTR: Final = f"{PREFIX}_judge_ctr"
    JUDGE_BOUNDARY: Final = f"{PREFIX}_judge_boundary_timestamp_seconds"
    # This process's own.
    JUDGMENTS_PUBLISHED: Final = f"{PREFIX}_judgments_published"
    JUDGMENTS_TOO_LARGE: Final = f"{PREFIX}_judgments_too_large"
    BUILD: Final = f"{PREFIX}_build"
    BATCH_DURATION: Final = f"{PREFIX}_batch_duration_seconds"
    BATCH_EVENTS: Final = f"{PREFIX}_batch_events"
    JUDGMENT_LATENCY: Final = f"{PREFIX}_judgment_to_metric_seconds"
    REDIS_ROUND_TRIP: Final = f"{PREFIX}_redis_round_trip_seconds"
    STATE_CACHE_LOOKUPS: Final = f"{PREFIX}_state_cache_lookups"
    STATE_CACHE_EVICTIONS: Final = f"{PREFIX}_state_cache_evictions"
    STATE_CACHE_STATES: Final = f"{PREFIX}_state_cache_states"
    STATE_CACHE_BYTES: Final = f"{PREFIX}_state_cache_estimated_bytes"
    CONSUMER_LAG: Final = f"{PREFIX}_consumer_lag"
    CONSUMER_HELD_BACK: Final = f"{PREFIX}_consumer_held_back_offsets"
    ASSIGNED_PARTITIONS: Final = f"{PREFIX}_assigned_partitions"
    BACKOFFS: Final = f"{PREFIX}_backoffs"
    OFFSETS_SKIPPED: Final = f"{PREFIX}_offsets_skipped"
    FENCED_BATCHES: Final = f"{PREFIX}_fenced_batches"
    DEAD_LETTERS_DROPPED: Final = f"{PREFIX}_dead_letters_dropped"
    SCRAPE_ERRORS: Final = f"{PREFIX}_scrape_errors"
    READY: Final = f"{PREFIX}_ready"
    # `stream-ndcg ubi-bridge`'s own.
    UBI_DOCUMENTS: Final = f"{PREFIX}_ubi_documents"
    UBI_SKIPPED: Final = f"{PREFIX}_ubi_skipped"
    UBI_CLICKS: Final = f"{PREFIX}_ubi_clicks"
    UBI_IMPRESSIONS: Final = f"{PREFIX}_ubi_impressions"


def total(counter: str) -> str:
    """The sample name of a counter."""
    return f"{counter}_total"
