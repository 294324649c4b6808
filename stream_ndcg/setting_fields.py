"""The declaration of every setting: one field each, with its default, parser, help line and
allowed values (`setting`). `config.Settings` composes them (it derives from `Declared`) with
what it does with them: checks across settings, loading, masking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stream_ndcg import setting_values as values
from stream_ndcg.click_models import MODELS
from stream_ndcg.errors import ConfigError
from stream_ndcg.experiments import Experiment
from stream_ndcg.metric import DEFAULT_CUTOFFS, DEFAULT_GAIN, DEFAULT_IDEAL, GAINS, IDEALS
from stream_ndcg.vocabulary import DEFAULT_JUDGMENT_SOURCES

T = TypeVar("T")


class SettingError(ConfigError):
    """One setting's value cannot work: `setting` names it, so that `Settings.load` can say
    where the value came from."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"setting {setting}: {problem}")
        self.setting = setting
        self.problem = problem


@dataclass(frozen=True)
class Spec:
    """How one setting is read, checked and explained (see `setting`)."""

    parse: Callable[[Any], Any]
    help: str
    metavar: str
    choices: tuple[str, ...] = ()
    secret: bool = False
    # A connection setting of every Kafka client: `simulate` takes these too.
    kafka: bool = False
    # The default as people read it, when the value itself says nothing (an empty string).
    shown_default: str = ""


def setting(default: T, help: str, parse: Callable[[Any], Any], *, metavar: str = "TEXT",
            choices: tuple[str, ...] = (), secret: bool = False, kafka: bool = False,
            shown_default: str = "") -> T:
    """A field of `Settings`: its default and everything its flag, variable, key and docs need."""
    spec = Spec(parse, help, metavar, choices, secret, kafka, shown_default)
    found: T = field(default=default, metadata={"spec": spec})
    return found


_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DURATION = "DURATION"
_DAY_MS = 86_400_000
_CLICK_GRADES = ("thresholds", "score")


@dataclass(frozen=True)
class Declared:
    """Every setting, declared; `config.Settings` is this with its checks and its reading."""

    bootstrap_servers: str = setting(
        "127.0.0.1:9092", "Kafka brokers, host:port, comma-separated", values.servers, metavar="HOST:PORT,...",
        kafka=True)
    security_protocol: str = setting(
        "PLAINTEXT", "how every Kafka client connects", values.choice(*_PROTOCOLS), metavar="PROTOCOL",
        choices=_PROTOCOLS, kafka=True)
    sasl_mechanism: str = setting(
        "", "SASL mechanism, needed with SASL_PLAINTEXT and SASL_SSL", values.choice("", *MECHANISMS),
        metavar="MECHANISM", choices=MECHANISMS, kafka=True)
    sasl_username: str = setting("", "SASL user name", values.as_text, kafka=True)
    sasl_password: str = setting("", "SASL password; masked in all output", values.as_text, secret=True, kafka=True)
    ssl_cafile: str = setting("", "PEM file of the CA that signed the brokers' certificates (SSL, SASL_SSL)",
                              values.as_text, metavar="FILE", kafka=True)
    ssl_certfile: str = setting("", "PEM client certificate, for brokers that require one", values.as_text,
                                metavar="FILE", kafka=True)
    ssl_keyfile: str = setting("", "PEM private key of ssl_certfile", values.as_text, metavar="FILE", kafka=True)
    topics: tuple[str, ...] = setting(
        ("search-events",), "input topics, comma-separated (both event types in one topic by default)", values.topics,
        metavar="TOPIC,...")
    dead_letter_topic: str = setting(
        "", "topic for rejected messages, with their origin and reason in headers", values.topic, metavar="TOPIC",
        shown_default="(off)")
    group_id: str = setting("stream-ndcg", "Kafka consumer group", values.word, metavar="GROUP")
    auto_offset_reset: str = setting(
        "earliest", "where a partition with no stored offset starts", values.choice("earliest", "latest"),
        metavar="WHERE", choices=("earliest", "latest"))
    fail_on_data_loss: bool = setting(
        False, "when Kafka deleted records the service had not read yet (see Operations): false skips them, "
        "counts and logs them; true leaves the partition unread and the service not ready until an operator "
        "restarts it with false or rebuilds", values.boolean, metavar="BOOL")
    redis_url: str = setting(
        "redis://127.0.0.1:6379/0", "redis://, rediss:// (TLS) or unix://, with user:password@ for an ACL user; "
        "the password is masked in all output", values.redis_url, metavar="URL", secret=True)
    redis_ca_file: str = setting("", "CA file to verify a rediss:// server", values.as_text, metavar="FILE")
    redis_cluster: bool = setting(
        False, "true for a Redis Cluster: redis_url names any one node (database 0), the client finds the "
        "others and follows slot moves", values.boolean, metavar="BOOL")
    redis_sentinels: str = setting(
        "", "Redis Sentinel addresses, host:port, comma-separated: the master of redis_sentinel_master is asked "
        "of them, and found again after a failover; redis_url then gives only the user, password, database and "
        "TLS", values.sentinels, metavar="HOST:PORT,...", shown_default="(none)")
    redis_sentinel_master: str = setting("mymaster", "the name under which the sentinels monitor the master",
                                         values.word, metavar="NAME")
    redis_wait_replicas: int = setting(
        0, "replicas that must confirm each commit (Redis WAIT) before it counts, so that a failover cannot "
        "lose it; one server or Sentinel only (0: off)", values.integer(0), metavar="N")
    redis_wait_timeout: int = setting(1_000, "how long a commit waits for those replicas", values.duration(1),
                                      metavar=DURATION)
    rebuild: bool = setting(
        False, "one-off: if the stored state cannot serve this metric configuration (see Operations), start it "
        "afresh and consume from the beginning of the topics", values.boolean, metavar="BOOL")
    namespace: str = setting(
        "", "prefix of every Redis key, so that pipelines can share one Redis or Redis Cluster", values.namespace,
        metavar="NAME", shown_default="(the group id)")
    state_cache_groups: int = setting(
        20_000, "query states kept in memory (LRU across all partitions), so that hot queries are not read back "
        "from Redis every batch, bounded by their groups (one query's impressions in one time bucket and "
        "segment) and by state_cache_mib, whichever is reached first (0: none)", values.integer(0), metavar="N")
    state_cache_mib: int = setting(
        128, "the most memory, in MiB, the cached query states may hold by their estimated size (a distinct "
        "ranked list about 1.4 KiB, a group about 4 KiB): what bounds the service's memory as the impressions "
        "held grow (0: no cache)", values.integer(0), metavar="MIB")
    # The formats `state.format` writes (its FORMAT_VERSION, and the ones before for a rollback).
    state_format: int = setting(
        8, "the Redis state format written: 8 (drill-down rows and impression ids in listpack-sized hashes), or 7 "
        "for one release, so that the state can still be handed back to the previous release (a rollback; 6 for "
        "the release before it); an instance set to an earlier format refuses state another already wrote in a "
        "later one", values.integer(6, 8), metavar="N")
    k: tuple[int, ...] = setting(DEFAULT_CUTOFFS, "cut-offs, comma-separated", values.cutoffs, metavar="K,...")
    gain: str = setting(DEFAULT_GAIN, "gain formula: exponential 2^grade - 1, or linear grade",
                        values.choice(*GAINS), metavar="GAIN", choices=GAINS)
    ideal: str = setting(DEFAULT_IDEAL, "ideal ordering: pool (every judged document of the query) or list (the "
                         "impression's own results)", values.choice(*IDEALS), metavar="IDEAL", choices=IDEALS)
    judgment_sources: tuple[str, ...] = setting(
        DEFAULT_JUDGMENT_SOURCES, "judgment sources whose grades count, comma-separated, first first: a document's "
        "grade is that of the first source that grades it; judgments of other sources are counted and ignored",
        values.judgment_sources, metavar="SOURCE,...")
    windows: tuple[int, ...] = setting(
        (300_000, 3_600_000, 86_400_000), "rolling windows, comma-separated (whole numbers of buckets)",
        values.durations, metavar="DURATION,...")
    bucket: int = setting(60_000, "time bucket of the state and the window edges (at least 1s)",
                          values.duration(1000), metavar=DURATION)
    grace: int = setting(600_000, "kept beyond the longest window", values.duration(0), metavar=DURATION)
    judgment_ttl: int = setting(
        30 * 86_400_000, "how long a query's judgments outlive its last event; older judgments are too_old",
        values.duration(1), metavar=DURATION)
    dedup_horizon: int = setting(
        3_600_000, "how long an impression id is remembered after it was accepted (by the clock), so that a "
        "producer's resend of the same impression is dropped; an id seen again later is a new impression",
        values.duration(1000), metavar=DURATION)
    clock: str = setting("wall", "what decides window edges and judge's boundaries: the wall clock or the newest "
                         "event time", values.choice("wall", "event"), metavar="CLOCK", choices=("wall", "event"))
    segment_labels: tuple[str, ...] = setting(
        ("variant",), "segment keys that become Prometheus labels, comma-separated", values.labels, metavar="LABEL,...")
    segment_cap: int = setting(20, "distinct values per label; later values become other, a missing key none",
                               values.integer(1), metavar="N")
    metrics_host: str = setting(
        "127.0.0.1", "bind address of /metrics; loopback by default so that nothing is exposed by accident: set "
        "0.0.0.0 in a container", values.word, metavar="HOST")
    metrics_port: int = setting(9464, "TCP port of /metrics, /healthz and /readyz", values.integer(1, 65535),
                                metavar="PORT")
    drilldown: bool = setting(
        True, "keep the per-query rows the drill-down API reads (false saves their Redis memory and upkeep, and turns "
        "the API off); set it alike on every instance of a group", values.boolean, metavar="BOOL")
    query_figures_interval: int = setting(
        5_000, "how often the drill-down's figures over queries (clustered errors, query-averaged means, queries) "
        "are brought up to date for /metrics and the API's summary, in a thread; served from the last computation "
        "in between (0: by every scrape and summary, as it asks)", values.duration(0), metavar=DURATION)
    api_host: str = setting(
        "127.0.0.1", "bind address of the drill-down API and page; loopback by default: query strings can be "
        "personal data", values.word, metavar="HOST")
    api_port: int = setting(9465, "TCP port of the drill-down API and page; 0 turns them off on this instance",
                            values.integer(0, 65535), metavar="PORT")
    api_token: str = setting("", "bearer token every API request must carry (empty: none); masked in all output",
                             values.as_text, secret=True)
    control: str = setting(
        "", "the segment value every other value of its label is compared with, as label=value (e.g. variant=A): "
        "the API's default control (empty: none)", values.segment_value, metavar="LABEL=VALUE")
    alpha: float = setting(
        0.05, "chance that an always-valid interval ever excludes the true difference while watched; with more "
        "than two arms split evenly among the comparisons with the control (Bonferroni)", values.fraction,
        metavar="P")
    n_star: int = setting(
        10_000, "impressions at which a team expects to decide a comparison: its always-valid interval is "
        "narrowest there", values.integer(1), metavar="N")
    experiments: tuple[Experiment, ...] = setting(
        (), "experiments, each compared since its start: in a TOML file an array of tables [[experiments]] with "
        "name, start, label, arms, control and optionally alpha, n_star and end; as a flag or variable the same "
        "keys as key=value, ',' between keys, ';' between experiments (docs/experiments.md)", values.experiments,
        metavar="EXPERIMENT;...", shown_default="(none)")
    experiment_retention: int = setting(
        90 * _DAY_MS, "how long an experiment's sums are kept in Redis after the last commit while it was "
        "registered (remove it from experiments to let them go)", values.duration(1000), metavar=DURATION)
    batch_size: int = setting(500, "records per batch", values.integer(1), metavar="N")
    linger: int = setting(100, "longest wait for a batch", values.duration(0), metavar=DURATION)
    max_results: int = setting(1000, "longest accepted list; longer impressions are rejected", values.integer(1),
                               metavar="N")
    max_message_bytes: int = setting(1_048_576, "largest accepted message, in bytes", values.integer(1), metavar="N")
    require_key: bool = setting(True, "reject messages without a Kafka key (keys keep a query on one partition)",
                                values.boolean, metavar="BOOL")
    max_future: int = setting(86_400_000, "reject event times further ahead of the wall clock", values.duration(0),
                              metavar=DURATION)
    click_model: str = setting(
        "coec", "the click model that turns clicks into judgments: clicks over expected clicks, or a cascade model",
        values.choice(*MODELS), metavar="MODEL", choices=MODELS)
    click_horizon: int = setting(
        14 * _DAY_MS, "how far back clicks count: older buckets of click counts are forgotten",
        values.duration(1000), metavar=DURATION)
    click_bucket: int = setting(_DAY_MS, "time bucket of the click counts, by the impression's time (the step of "
                                "click_horizon)", values.duration(1000), metavar=DURATION)
    click_max_rank: int = setting(20, "deepest rank the click models count: results and clicks below it are ignored",
                                  values.integer(1, 1000), metavar="N")
    click_min_impressions: int = setting(
        20, "impressions of a (query, document) pair in click_horizon below which it gets no grade from clicks (a "
        "grade it had is retracted)", values.integer(1), metavar="N")
    click_session: int = setting(
        1_800_000, "how long after an impression its clicks are taken, and how long a click waits for its "
        "impression; then they are final", values.duration(0), metavar=DURATION)
    judge_interval: int = setting(3_600_000, "how often click judgments are decided: at every multiple of this on "
                                  "the clock", values.duration(1000), metavar=DURATION)
    click_grade: str = setting(
        "thresholds", "a click model's score becomes a grade 0-3 by click_thresholds, or is the grade itself (for "
        "gain linear)", values.choice(*_CLICK_GRADES), metavar="HOW", choices=_CLICK_GRADES)
    click_thresholds: tuple[float, ...] = setting(
        (), "three ascending scores, the least scores of grades 1, 2 and 3", values.thresholds, metavar="T1,T2,T3",
        shown_default="(coec 0.5,1,2; sdbn 0.1,0.3,0.6)")
    ubi_queries_topic: str = setting("ubi_queries", "ubi-bridge: topic of the UBI queries (searches), keyed by UBI "
                                     "query_id", values.topic, metavar="TOPIC")
    ubi_events_topic: str = setting("ubi_events", "ubi-bridge: topic of the UBI events, keyed by UBI query_id, with "
                                    "as many partitions as ubi_queries_topic", values.topic, metavar="TOPIC")
    ubi_output_topic: str = setting("search-events", "ubi-bridge: where its impressions and clicks go, keyed by the "
                                    "query text: a topic judge and run read", values.topic, metavar="TOPIC")
    ubi_group_id: str = setting("stream-ndcg-ubi-bridge", "ubi-bridge: its Kafka consumer group", values.word,
                                metavar="GROUP")
    ubi_click_wait: int = setting(600_000, "ubi-bridge: how long (by UBI timestamps) a click waits for its search; "
                                  "then it is unjoined and dropped", values.duration(0), metavar=DURATION)
    ubi_search_ttl: int = setting(
        1_800_000, "ubi-bridge: how long after a search its clicks are joined (later ones are too late); keep it "
        "within run's dedup_horizon, which must cover the bridge's rereads", values.duration(1000), metavar=DURATION)
    ubi_impression_wait: int = setting(
        60_000, "ubi-bridge: for a search without query_response_hit_ids, how long after it its UBI impression "
        "events make its results", values.duration(0), metavar=DURATION)
    ubi_excluded_clients: tuple[str, ...] = setting(
        (), "ubi-bridge: client_id glob patterns (* ? [seq], case-sensitive), comma-separated, whose searches "
        "and events are skipped (bots)", values.csv, metavar="GLOB,...", shown_default="(none)")
    judge_group_id: str = setting("stream-ndcg-judge", "judge's Kafka consumer group", values.word, metavar="GROUP")
    judge_idle: int = setting(
        30_000, "how long a partition of judge has had nothing to read before it counts as past the boundary the "
        "other partitions wait at, on the event clock", values.duration(0), metavar=DURATION)
    log_format: str = setting("text", "log lines as text or one JSON object each", values.choice("text", "json"),
                              metavar="FORMAT", choices=("text", "json"))
    log_level: str = setting("INFO", "lowest level logged (any case)", values.choice(*_LOG_LEVELS, fold=True),
                             metavar="LEVEL", choices=_LOG_LEVELS)
