"""The service's parts built from `Settings`, in one place: `run`, `check-config`, the history and
the benches build them here, so that a setting reaches every part that reads it.

The parts themselves take plain values (a cut-off list, a horizon in milliseconds), never the
settings object; this module is where the one becomes the other.

    store = wiring.redis_store(settings)
    pipeline = wiring.batch_pipeline(settings, store, wiring.engine(settings))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, cast

from stream_ndcg import reconfigure
from stream_ndcg.click_judge import ClickJudge, JudgeSettings
from stream_ndcg.click_models import Grading, Model
from stream_ndcg.config import Settings
from stream_ndcg.consumer import ProcessorOptions
from stream_ndcg.engine import Engine
from stream_ndcg.events import Limits
from stream_ndcg.pipeline import BatchPipeline, RecordChecks
from stream_ndcg.segments import SegmentProjector
from stream_ndcg.state.base import StateStore

if TYPE_CHECKING:  # the Redis client is imported by whoever makes a Redis store, not by importers
    from stream_ndcg.dead_letters import DeadLetters
    from stream_ndcg.state.judge_redis import RedisJudgeStore
    from stream_ndcg.state.redis import RedisStore


def engine(settings: Settings, *, drilldown: bool | None = None) -> Engine:
    """The engine of the settings' metric and horizons; `drilldown` overrides the setting (a history
    keeps the window gauges only)."""
    return Engine(settings.measure, settings.bucket, horizon_ms=settings.horizon,
                  judgment_max_age_ms=settings.judgment_ttl, dedup_horizon_ms=settings.dedup_horizon,
                  drilldown=settings.drilldown if drilldown is None else drilldown,
                  query_credits=bool(settings.experiments))


def record_checks(settings: Settings, *, require_key: bool | None = None) -> RecordChecks:
    """The checks of each record; `require_key` overrides the setting (files carry no Kafka keys)."""
    return RecordChecks(Limits(max_results=settings.max_results, max_message_bytes=settings.max_message_bytes),
                        require_key=settings.require_key if require_key is None else require_key,
                        max_future_ms=settings.max_future)


def batch_pipeline(settings: Settings, store: StateStore, engine: Engine, *, require_key: bool | None = None,
                   event_clock: bool | None = None, dead_letters: DeadLetters | None = None) -> BatchPipeline:
    """Records to committed state, with the settings' checks and segment label policy; `event_clock`
    overrides the setting (a history runs on the event clock)."""
    return BatchPipeline(
        store, engine, record_checks(settings, require_key=require_key),
        event_clock=settings.clock == "event" if event_clock is None else event_clock,
        projector=SegmentProjector(store, settings.segment_labels, settings.segment_cap),
        dead_letters=dead_letters, experiments=settings.experiments)


def click_judge(settings: Settings) -> ClickJudge:
    """The click model of the settings: its grading, horizon, buckets, ranks, session and interval; an
    impression id is remembered for duplicates as long as `run` remembers it (`dedup_horizon`)."""
    thresholds = settings.click_thresholds
    grading = Grading(cast(Model, settings.click_model), settings.click_min_impressions,
                      cast(Literal["thresholds", "score"], settings.click_grade),
                      (thresholds[0], thresholds[1], thresholds[2]) if thresholds else None)
    return ClickJudge(JudgeSettings(grading, horizon_ms=settings.click_horizon, bucket_ms=settings.click_bucket,
                                    max_rank=settings.click_max_rank, session_ms=settings.click_session,
                                    interval_ms=settings.judge_interval, dedup_ms=settings.dedup_horizon))


def processor_options(settings: Settings) -> ProcessorOptions:
    """What the consumer loop reads of the settings."""
    return ProcessorOptions(
        topics=settings.topics, linger_ms=settings.linger, batch_size=settings.batch_size,
        start_from="earliest" if settings.auto_offset_reset == "earliest" else "latest",
        metric_config=reconfigure.configured(settings), rebuild=settings.rebuild,
        fail_on_data_loss=settings.fail_on_data_loss)


def redis_store(settings: Settings,
                observe_round_trip: Callable[[float], None] = lambda seconds: None) -> RedisStore:
    """The Redis store of the settings: its server or cluster, namespace, horizons, clock and cache."""
    from stream_ndcg.state.redis import RedisStore
    from stream_ndcg.state.redis_reads import connect

    return RedisStore(
        lambda: connect(settings.redis_url, cluster=settings.redis_cluster, ca_file=settings.redis_ca_file,
                        sentinels=settings.redis_sentinels, master=settings.redis_sentinel_master),
        namespace=settings.key_namespace,
        bucket_ms=settings.bucket,
        horizon_ms=settings.horizon,
        state_ttl_ms=settings.judgment_ttl,
        dedup_horizon_ms=settings.dedup_horizon,
        wall_clock=settings.clock == "wall",
        cache_groups=settings.state_cache_groups,
        cache_bytes=settings.state_cache_mib * 2**20,
        write_format=settings.state_format,
        experiment_ttl_ms=settings.experiment_retention,
        wait_replicas=settings.redis_wait_replicas,
        wait_timeout_ms=settings.redis_wait_timeout,
        observe_round_trip=observe_round_trip,
    )


def judge_store(settings: Settings) -> RedisJudgeStore:
    """The judge's store of the settings: `judge` writes it, `judgments export` and the drill-down
    read it, all under `key_namespace`."""
    from stream_ndcg.state.judge_redis import RedisJudgeStore
    from stream_ndcg.state.redis_reads import connect

    return RedisJudgeStore(lambda: connect(settings.redis_url, cluster=settings.redis_cluster,
                                           ca_file=settings.redis_ca_file, sentinels=settings.redis_sentinels,
                                           master=settings.redis_sentinel_master),
                           namespace=settings.key_namespace)
