"""Experiments as the API and the replay report them: per arm its mean and errors, and every other
arm against the control, plain and stratified by query, with the always-valid interval.

    reports = ExperimentReports(store, settings.experiments, cutoffs=(10,), bucket_ms=60_000)
    reports.listing()              # /api/v1/experiments
    reports.one("ranker-v2")       # /api/v1/experiments/ranker-v2

The statistics are `comparisons`', from the experiment's cells (`experiments`): an arm's plain
figures from its sums over queries, the stratified difference from its per-query
(n_q, s_q, ss_q). With more than two arms each comparison with the control takes
alpha / (arms - 1) (Bonferroni).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from stream_ndcg.comparisons import (
    Cell,
    Comparison,
    against_control,
    bonferroni,
    clustered_mean,
    mean_estimate,
    plain_difference,
    stratified_difference_of,
)
from stream_ndcg.drilldown.compare import CORRECTION, shown
from stream_ndcg.errors import NotFound
from stream_ndcg.experiments import Experiment
from stream_ndcg.state.base import StateStore
from stream_ndcg.vocabulary import IMPRESSIONS, MOMENTS, ndcg_at, ndcg_squares_at, scored_at

# The API's route of the experiments (`drilldown.api`).
EXPERIMENTS = "/api/v1/experiments"


def arm_cells(cells: Mapping[tuple[str, str, str], float], k: int) -> tuple[dict[str, dict[str, Cell]], set[str]]:
    """Per arm, each query's (n_q, s_q, ss_q) at cut-off k; and the arms whose squares miss
    impressions (a group whose lists were not all known: their errors are unknown)."""
    by_arm: dict[str, dict[str, list[float]]] = {}
    slots = {scored_at(k): 0, ndcg_at(k): 1, ndcg_squares_at(k): 2, IMPRESSIONS: 3, MOMENTS: 4}
    for (arm, query_id, name), value in cells.items():
        slot = slots.get(name)
        if slot is not None:
            by_arm.setdefault(arm, {}).setdefault(query_id, [0.0] * 5)[slot] = value
    partial = {arm for arm, queries in by_arm.items()
               if any(held[3] != held[4] for held in queries.values())}
    return ({arm: {query: (held[0], held[1], held[2]) for query, held in queries.items() if held[0] > 0}
             for arm, queries in by_arm.items()}, partial)


def report(experiment: Experiment, cells: Mapping[tuple[str, str, str], float], cutoffs: Sequence[int],
           counting_from_ms: int | None = None) -> dict[str, Any]:
    """An experiment's figures as the API and the replay give them: per cut-off, per arm its mean
    with the impression-level and query-clustered standard errors, and each other arm against the
    control, plain and stratified by query, with the always-valid interval at the Bonferroni share
    of the experiment's alpha."""
    alpha, n_star = experiment.alpha_or_default, experiment.n_star_or_default
    per_k: dict[str, Any] = {}
    for k in cutoffs:
        queries, partial = arm_cells(cells, k)
        totals = {arm: _totals(queries.get(arm, {})) for arm in experiment.arms}
        arms: dict[str, Any] = {}
        for arm in experiment.arms:
            n, total, squares = totals[arm]
            estimate = None if arm in partial else mean_estimate(n, total, squares)
            clustered = clustered_mean((q_n, q_s) for q_n, q_s, _ in queries.get(arm, {}).values())
            arms[arm] = {"scored_impressions": n, "queries": len(queries.get(arm, {})),
                         "ndcg_mean": total / n if n else None,
                         "ndcg_standard_error": None if estimate is None else estimate.standard_error,
                         "ndcg_clustered_standard_error": None if clustered is None else clustered.standard_error}
        # An arm whose squares miss impressions has no error: nothing of it is compared.
        known = {arm: (totals[arm], queries.get(arm, {})) for arm in experiment.arms if arm not in partial}
        if experiment.control in known:
            plain = against_control(known, experiment.control, lambda a, b: plain_difference(a[0], b[0]), alpha,
                                    n_star)
            stratified = against_control(known, experiment.control,
                                         lambda a, b: stratified_difference_of(a[1], b[1]), alpha, n_star)
        else:
            plain, stratified = {}, {}
        per_k[str(k)] = {"arms": arms, "comparisons": {
            arm: {"plain": shown(plain.get(arm)), "stratified": shown(stratified.get(arm)),
                  "decided": {"plain": _decided(plain.get(arm)), "stratified": _decided(stratified.get(arm))}}
            for arm in experiment.arms if arm != experiment.control}}
    return {"name": experiment.name, "label": experiment.label, "arms": list(experiment.arms),
            "control": experiment.control, "start_ms": experiment.start_ms, "end_ms": experiment.end_ms,
            "open": experiment.end_ms is None, "counting_from_ms": counting_from_ms,
            "alpha": alpha, "alpha_each": bonferroni(alpha, len(experiment.arms)),
            "correction": CORRECTION, "n_star": n_star, "k": per_k}


def _decided(comparison: Comparison | None) -> bool:
    """Whether the always-valid interval excludes 0 (no comparison yet: not decided)."""
    return comparison is not None and comparison.decided


def _totals(queries: Mapping[str, Cell]) -> tuple[float, float, float]:
    """An arm's (n, sum, sum of squares) over its queries."""
    return (math.fsum(n for n, _, _ in queries.values()), math.fsum(s for _, s, _ in queries.values()),
            math.fsum(ss for _, _, ss in queries.values()))


def experiments_answer(reports: ExperimentReports | None, path: str) -> dict[str, Any]:
    """/api/v1/experiments (every one) or /api/v1/experiments/<name> (an experiment's name holds
    no '/')."""
    name = unquote(path.removeprefix(EXPERIMENTS).strip("/"))
    if not name:
        return reports.listing() if reports is not None else {"experiments": []}
    if reports is None:
        raise NotFound("experiment", f"{name!r} is not registered (the experiments setting)")
    return reports.one(name)


class ExperimentReports:
    """The experiments' reports from a store's cells: what /api/v1/experiments answers."""

    def __init__(self, store: StateStore, experiments: Sequence[Experiment], cutoffs: Sequence[int],
                 bucket_ms: int) -> None:
        self.store = store
        self.experiments = {experiment.name: experiment for experiment in experiments}
        self.cutoffs = tuple(cutoffs)
        self.bucket_ms = bucket_ms

    def listing(self) -> dict[str, Any]:
        """Every experiment registered, with its figures."""
        return {"experiments": [self.one(name) for name in self.experiments]}

    def one(self, name: str) -> dict[str, Any]:
        experiment = self.experiments.get(name)
        if experiment is None:
            raise NotFound("experiment", f"{name!r} is not registered (the experiments setting)")
        # A rebuild moves the state to a new generation of keys: read the newest.
        self.store.follow()
        read = self.store.experiment(name)
        # From this time on every partition counts the experiment's every impression.
        counting_from = max(read.first_buckets.values(), default=None)
        return report(experiment, read.cells, self.cutoffs,
                      None if counting_from is None else counting_from * self.bucket_ms)

