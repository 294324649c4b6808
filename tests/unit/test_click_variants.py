"""On the simulator's data, nDCG from click judgments ranks the truly better variant first, as nDCG
from the true grades does (issue #28).

The simulator's variant A ranks a query's documents by their hidden true grade plus a little
noise, B with much more; users click by a position-based model of those grades. The raters'
judgments here are the true grades themselves (every shown document, no revision), so a replay
without a click model scores the variants with the truth, and `--click-model coec|sdbn` with
judgments decided from the clicks alone (the raters' set aside). The replay, not the services:
tests/integration/test_judge.py shows `judge` + `run` give the replay's figures to 1e-9.
"""

from __future__ import annotations

from typing import Any

import pytest

from stream_ndcg import wiring
from stream_ndcg.config import Settings
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay

K = "10"
# Half an hour of searches on 200 queries, judged every 5 minutes of it: each model decides
# several boundaries, and the most searched queries pass click_min_impressions.
SPEC = SimulationSpec(events=30_000, seed=23, queries=200, rate=15.0, clicks=True, judged_share=1.0,
                      unshown_judged_share=0.0, revision_share=0.0, retraction_share=0.0, max_delay_ms=10_000)
CLICK_SETTINGS = {"judge_interval": "5m", "click_session": "2m", "click_bucket": "10m", "click_horizon": "1h"}


@pytest.fixture(scope="module")
def messages() -> list[bytes]:
    return [value for _, value in Simulator(SPEC).messages()]


def by_variant(messages: list[bytes], model: str | None) -> dict[str, dict[str, Any]]:
    """Each variant's figures at K: from the raters' (true) grades, or from `model`'s judgments."""
    settings = Settings.load(flags={**CLICK_SETTINGS, "click_model": model or "coec"})
    replay = Replay(Measure(cutoffs=(int(K),)), dedup_horizon_ms=settings.dedup_horizon,
                    click_judge=wiring.click_judge(settings) if model else None)
    for value in messages:
        replay.add(value)
    summary = replay.summary()
    if model:
        assert summary["click_judgments"]["boundaries"] >= 5
        assert summary["click_judgments"]["set_aside"] > 0, "the raters' judgments are not the ones scored with"
    return {variant: figures[K] for variant, figures in summary["by_segment"]["variant"].items()}


@pytest.mark.parametrize("model", ["coec", "sdbn"])
def test_click_judgments_rank_the_truly_better_variant_first(messages: list[bytes], model: str) -> None:
    truth = by_variant(messages, None)
    clicks = by_variant(messages, model)
    assert truth["A"]["ndcg_mean"] > truth["B"]["ndcg_mean"]
    assert clicks["A"]["ndcg_mean"] > clicks["B"]["ndcg_mean"], (model, clicks, truth)
    # Scored on the same searches: most of each variant's impressions have graded documents.
    for variant in ("A", "B"):
        assert clicks[variant]["scored_impressions"] > clicks[variant]["impressions"] / 2, (model, clicks)
