"""Experiments: comparisons anchored at a start, over everything since, where the always-valid
interval's guarantee holds.

Pure, standard library only. An experiment names a segment label, its arms (values of that label)
and a control among them; from its start (and until its end, once closed) every impression whose
segment has an arm's value adds, per arm and per query, its scored impressions, nDCG sum and sum
of squares per cut-off to the experiment's cells. The cells are cumulative: they outlive the
buckets the windows read, and a late judgment re-credits them as it re-credits a window, by the
difference of the group's sums (`cell_changes`, from `engine.BatchOutcome.query_credits`), as long
as the group is held (the horizon).

An experiment counts whole buckets: those that start at or after its start and before its end.
A store marks, per partition, the first bucket it counts (`StateStore.commit`): the start's, or,
for an experiment registered while the partition already had state, the bucket after the
partition's clock then, so that no group is counted only in part.

    experiment = Experiment("ranker-v2", start_ms=1_700_000_000_000, label="variant", arms=("A", "B"),
                            control="A")
    changes = cell_changes(outcome.query_credits, [experiment], bucket_ms=60_000)

`drilldown.experiments` reports them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from stream_ndcg.comparisons import ALPHA, N_STAR
from stream_ndcg.vocabulary import (
    IMPRESSIONS,
    MOMENTS,
    AggregateKey,
    ndcg_at,
    ndcg_squares_at,
    parse_segment_key,
    scored_at,
)

# (arm, query, figure) -> sum: an experiment's cells, the figures those of `FIGURES`.
Cells = dict[tuple[str, str, str], float]
# experiment name -> (its first bucket, (bucket, arm, query, figure) -> change): what one batch
# adds to the cells.
CellChanges = dict[str, tuple[int, dict[tuple[int, str, str, str], float]]]


@dataclass(frozen=True)
class Experiment:
    """A comparison of `arms` (values of segment label `label`) with `control`, from `start_ms`
    on (and before `end_ms`, once it is closed), at `alpha` and `n_star` (`comparisons`)."""

    name: str
    start_ms: int
    label: str
    arms: tuple[str, ...]
    control: str
    # None: the settings' alpha and n_star (`with_defaults`).
    alpha: float | None = None
    n_star: int | None = None
    end_ms: int | None = None

    def with_defaults(self, alpha: float, n_star: int) -> Experiment:
        return replace(self, alpha=self.alpha if self.alpha is not None else alpha,
                       n_star=self.n_star if self.n_star is not None else n_star)

    @property
    def alpha_or_default(self) -> float:
        return self.alpha if self.alpha is not None else ALPHA

    @property
    def n_star_or_default(self) -> int:
        return self.n_star if self.n_star is not None else N_STAR

    def first_bucket(self, bucket_ms: int) -> int:
        """The first bucket counted: the first that starts at or after the start."""
        return -(-self.start_ms // bucket_ms)

    def counts(self, bucket: int, bucket_ms: int) -> bool:
        """Whether the experiment counts a bucket (before its mark: `StateStore.commit`)."""
        return bucket >= self.first_bucket(bucket_ms) and (self.end_ms is None or bucket * bucket_ms < self.end_ms)

    def recorded(self) -> dict[str, object]:
        """What the state records of it (`reconfigure`): what its cells hold, and how it is read."""
        return {"name": self.name, "start": self.start_ms, "label": self.label, "arms": list(self.arms),
                "control": self.control, "alpha": self.alpha, "n_star": self.n_star, "end": self.end_ms}


def figures(cutoffs: Iterable[int]) -> tuple[str, ...]:
    """The figures of a cell: impressions, those whose squares are known, and per cut-off the
    scored impressions, nDCG sum and sum of squares."""
    return (IMPRESSIONS, MOMENTS, *(name(k) for k in cutoffs for name in (scored_at, ndcg_at, ndcg_squares_at)))


def cell_changes(query_credits: Mapping[str, Mapping[AggregateKey, float]], experiments: Sequence[Experiment],
                 bucket_ms: int) -> CellChanges:
    """The cells' changes of a batch, from the engine's credit differences per query (query ->
    (bucket, segment key, field) -> change): every experiment gets an entry, empty or not, since
    a store marks an experiment's first bucket at its first commit."""
    changes: CellChanges = {experiment.name: (experiment.first_bucket(bucket_ms), {}) for experiment in experiments}
    for query_id, credits in query_credits.items():
        for (bucket, segment, name), change in credits.items():
            if not _is_figure(name):
                continue
            values = parse_segment_key(segment)
            for experiment in experiments:
                arm = values.get(experiment.label)
                if arm in experiment.arms and experiment.counts(bucket, bucket_ms):
                    into = changes[experiment.name][1]
                    key = (bucket, arm, query_id, name)
                    into[key] = into.get(key, 0.0) + change
    return changes


def _is_figure(name: str) -> bool:
    return name in (IMPRESSIONS, MOMENTS) or name.startswith(("scored@", "ndcg@", "ndcg_sq@"))


def impression_cells(experiment: Experiment, impressions: Iterable[tuple[str, int, Mapping[str, str],
                                                                          Mapping[int, float | None]]],
                     bucket_ms: int) -> Cells:
    """The cells from scratch, from every impression's (query, time, segment, nDCG per cut-off):
    the replay's batch computation, which the service's cells must equal. Every figure of an arm's
    query is there, 0 where no nDCG of it is defined, as in the sums it is recomputed from
    (`metric.list_sums`, `metric.pooled_ndcg`): the service holds a figure it moved and moved back
    (an impression scored while its query's pool had a judgment, unscored once it was retracted)."""
    terms: dict[tuple[str, str, str], list[float]] = {}
    for query_id, ts, segment, ndcg in impressions:
        arm = segment.get(experiment.label)
        if arm not in experiment.arms or not experiment.counts(ts // bucket_ms, bucket_ms):
            continue
        for name in (IMPRESSIONS, MOMENTS):
            terms.setdefault((arm, query_id, name), []).append(1.0)
        for k, value in ndcg.items():
            # An undefined nDCG adds nothing to the figures (`metric.ndcg_sums`).
            scored, defined = (0.0, 0.0) if value is None else (1.0, value)
            terms.setdefault((arm, query_id, scored_at(k)), []).append(scored)
            terms.setdefault((arm, query_id, ndcg_at(k)), []).append(defined)
            terms.setdefault((arm, query_id, ndcg_squares_at(k)), []).append(defined * defined)
    return {key: math.fsum(values) for key, values in terms.items()}


NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_KEYS = ("name", "start", "label", "arms", "control", "alpha", "n_star", "end")
FLAG_FORM = ("name=ranker-v2,start=2026-11-20T00:00:00Z,label=variant,arms=A|B,control=A[,alpha=0.05]"
             "[,n_star=10000][,end=...]; name=...")


def parse_experiments(value: object) -> tuple[Experiment, ...]:
    """The experiments of a setting: a TOML array of tables ({name, start, label, arms, control,
    alpha, n_star, end}), or its flag and environment form, `FLAG_FORM` (experiments separated by
    ';', their keys by ',', arms by '|'); ValueError naming the experiment and what is wrong."""
    if isinstance(value, str):
        tables: list[object] = [_flag_table(part) for part in value.split(";") if part.strip()]
    elif isinstance(value, list | tuple):
        tables = list(value)
    else:
        raise ValueError(f"{value!r} is neither an array of tables nor the form {FLAG_FORM}")
    found = tuple(item if isinstance(item, Experiment) else _experiment(item) for item in tables)
    names = [experiment.name for experiment in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"experiment name(s) {', '.join(twice)} given twice: each names its sums")
    return found


def _flag_table(text: str) -> dict[str, object]:
    table: dict[str, object] = {}
    for item in text.split(","):
        key, equals, given = item.partition("=")
        if not equals:
            raise ValueError(f"{item.strip()!r} in {text.strip()!r} is not key=value (the form: {FLAG_FORM})")
        table[key.strip()] = given.split("|") if key.strip() == "arms" else given.strip()
    return table


def _experiment(table: object) -> Experiment:
    if not isinstance(table, dict):
        raise ValueError(f"{table!r} is not a table of an experiment's keys ({', '.join(_KEYS)})")
    name = table.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"an experiment's name {name!r}: letters, digits, '_', '.' and '-', up to 100")
    where = f"experiment {name}"
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})")
    for key in ("start", "label", "arms", "control"):
        if table.get(key) in (None, ""):
            raise ValueError(f"{where}: {key} is missing")
    arms = table["arms"]
    if not isinstance(arms, list | tuple) or not all(isinstance(arm, str) and arm.strip() for arm in arms):
        raise ValueError(f"{where}: arms {arms!r} must be a list of segment values")
    arms = tuple(arm.strip() for arm in arms)
    if len(arms) < 2 or len(set(arms)) != len(arms):
        raise ValueError(f"{where}: arms {'|'.join(arms)} must be two or more distinct values")
    if any(not arm.isprintable() for arm in arms):
        raise ValueError(f"{where}: arms {arms!r} hold a control character")
    control = str(table["control"]).strip()
    if control not in arms:
        raise ValueError(f"{where}: the control {control!r} is not one of its arms ({'|'.join(arms)})")
    start = _time_ms(table["start"], where, "start")
    end = None if table.get("end") in (None, "") else _time_ms(table["end"], where, "end")
    if end is not None and end <= start:
        raise ValueError(f"{where}: end must be after start")
    alpha = None if table.get("alpha") in (None, "") else _alpha(table["alpha"], where)
    n_star = None if table.get("n_star") in (None, "") else _n_star(table["n_star"], where)
    return Experiment(name, start, str(table["label"]).strip(), arms, control, alpha, n_star, end)


def _time_ms(value: object, where: str, key: str) -> int:
    """Epoch milliseconds, an ISO 8601 time with its offset, or a TOML offset date-time."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).strip())
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ValueError(f"{where}: {key} {value!r} is not epoch milliseconds or an ISO 8601 time with its "
                         "offset (e.g. 2026-11-20T00:00:00Z)")
    return round(moment.timestamp() * 1000)


def _alpha(value: object, where: str) -> float:
    try:
        alpha = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        alpha = math.nan
    if isinstance(value, bool) or not 0 < alpha < 1:
        raise ValueError(f"{where}: alpha {value!r} must be between 0 and 1, both excluded")
    return alpha


def _n_star(value: object, where: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"{where}: n_star {value!r} must be a whole number of impressions, at least 1")
    return int(text)
