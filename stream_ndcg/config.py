"""Settings: frozen and validated once, read from flags, `STREAM_NDCG_*` variables or a TOML file.

Precedence: flags, then environment variables, then the TOML file (``--config``
or ``STREAM_NDCG_CONFIG``), then defaults. Every setting has the same name in
all three: ``--batch-size``, ``STREAM_NDCG_BATCH_SIZE``, ``batch_size = 500``.

    settings = Settings.load(flags={"k": "5,10"}, environ=os.environ)
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from stream_ndcg.errors import ConfigError
from stream_ndcg.metric import DEFAULT_CUTOFFS, GAINS, IDEALS, Measure

ENV_PREFIX = "STREAM_NDCG_"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = {"pipeline", "k", "window", "type", "reason", "le", "partition", "topic", "job", "instance"}


def parse_duration_ms(text: str | int) -> int:
    """'5m' -> 300000; a bare integer is milliseconds."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", str(text))
    if not match:
        raise ConfigError(f"{text!r} is not a duration (examples: 500ms, 30s, 5m, 1h, 7d)")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def _csv(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(part.strip() for part in str(value).split(",") if part.strip())


def parse_cutoffs(value: Any) -> tuple[int, ...]:
    """The cut-offs k of a setting, a flag or a TOML array: '5,10' or [5, 10], checked as `Measure` checks them."""
    try:
        cutoffs = tuple(int(v) for v in _csv(value))
    except ValueError:
        raise ConfigError(f"k must be a comma-separated list of integers, got {value!r}") from None
    try:
        Measure(cutoffs=cutoffs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cutoffs


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{value!r} is not an integer") from None


def _durations(value: Any) -> tuple[int, ...]:
    return tuple(parse_duration_ms(v) for v in _csv(value))


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{value!r} is not a boolean")


_COERCE: dict[str, Callable[[Any], Any]] = {
    "topics": _csv, "k": parse_cutoffs, "windows": _durations, "segment_labels": _csv,
    "bucket": parse_duration_ms, "grace": parse_duration_ms, "judgment_ttl": parse_duration_ms,
    "linger": parse_duration_ms, "batch_size": _int, "segment_cap": _int, "metrics_port": _int,
    "max_results": _int, "max_message_bytes": _int, "state_cache_groups": _int, "require_key": _bool,
    "redis_cluster": _bool, "rebuild": _bool, "fail_on_data_loss": _bool,
    "max_future": parse_duration_ms,
}


@dataclass(frozen=True)
class Settings:
    """The service's whole configuration. Durations are in milliseconds."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    topics: tuple[str, ...] = ("search-events",)
    dead_letter_topic: str = ""
    group_id: str = "stream-ndcg"
    auto_offset_reset: str = "earliest"
    # Stop reading a partition (not ready) instead of skipping records Kafka deleted before they were read.
    fail_on_data_loss: bool = False
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_ca_file: str = ""
    redis_cluster: bool = False
    rebuild: bool = False
    # Empty: the group id, so that every consumer group has state of its own.
    namespace: str = ""
    state_cache_groups: int = 20_000
    k: tuple[int, ...] = DEFAULT_CUTOFFS
    gain: str = "exponential"
    ideal: str = "pool"
    windows: tuple[int, ...] = (300_000, 3_600_000, 86_400_000)
    bucket: int = 60_000
    grace: int = 600_000
    judgment_ttl: int = 30 * 86_400_000
    clock: str = "wall"
    segment_labels: tuple[str, ...] = ("variant",)
    segment_cap: int = 20
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    batch_size: int = 500
    linger: int = 100
    max_results: int = 1000
    max_message_bytes: int = 1_048_576
    require_key: bool = True
    max_future: int = 86_400_000
    log_format: str = "text"
    log_level: str = "INFO"
    secrets: frozenset[str] = field(default=frozenset({"redis_url", "sasl_password"}), repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            Measure(cutoffs=self.k, gain=self.gain, ideal=self.ideal)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.gain not in GAINS or self.ideal not in IDEALS:
            raise ConfigError("gain and ideal must be known formulas")
        if not self.topics:
            raise ConfigError("at least one topic is needed")
        if self.clock not in ("wall", "event"):
            raise ConfigError(f"clock must be 'wall' or 'event', got {self.clock!r}")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ConfigError("auto_offset_reset must be 'earliest' or 'latest'")
        if self.bucket < 1000:
            raise ConfigError("bucket must be at least 1s")
        if not self.windows or any(w < self.bucket or w % self.bucket for w in self.windows):
            raise ConfigError(f"each window must be a whole number of buckets ({format_duration(self.bucket)})")
        if len(set(self.windows)) != len(self.windows):
            raise ConfigError("windows must be distinct")
        for label in self.segment_labels:
            if not _LABEL.match(label) or label in _RESERVED_LABELS:
                raise ConfigError(f"segment label {label!r} is not a usable Prometheus label name")
        if self.state_cache_groups < 0:
            raise ConfigError("state_cache_groups must not be negative")
        if self.segment_cap < 1:
            raise ConfigError("segment_cap must be at least 1")
        if not 0 < self.metrics_port < 65536:
            raise ConfigError("metrics_port must be a TCP port")
        if self.batch_size < 1 or self.linger < 0 or self.max_results < 1 or self.max_message_bytes < 1:
            raise ConfigError("batch_size, max_results and max_message_bytes must be positive, linger not negative")
        if self.log_format not in ("text", "json"):
            raise ConfigError("log_format must be 'text' or 'json'")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.key_namespace):
            raise ConfigError("namespace (by default the group id) may hold letters, digits, '_', '.' and '-' only")
        if urlsplit(self.redis_url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigError("redis_url must be redis://, rediss:// or unix://")
        if self.redis_cluster and (urlsplit(self.redis_url).scheme == "unix"
                                   or urlsplit(self.redis_url).path.strip("/") not in ("", "0")):
            raise ConfigError("a Redis Cluster is reached over TCP and has database 0 only")
        if self.security_protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ConfigError("security_protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
                raise ConfigError("sasl_mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with SASL")
            if not self.sasl_username or not self.sasl_password:
                raise ConfigError("SASL needs sasl_username and sasl_password")
        if self.max_future < 0:
            raise ConfigError("max_future must not be negative")
        if self.dead_letter_topic and self.dead_letter_topic in self.topics:
            raise ConfigError("the dead-letter topic cannot be an input topic")

    @property
    def measure(self) -> Measure:
        return Measure(cutoffs=self.k, gain=self.gain, ideal=self.ideal)  # type: ignore[arg-type]

    @property
    def key_namespace(self) -> str:
        return self.namespace or self.group_id

    @property
    def metric_config(self) -> dict[str, object]:
        """What the stored numbers mean: state built with other values cannot be continued."""
        return {"k": list(self.k), "gain": self.gain, "ideal": self.ideal, "bucket": self.bucket,
                "windows": list(self.windows), "segment_labels": list(self.segment_labels)}

    @property
    def horizon(self) -> int:
        """How far back state is kept: the longest window plus the grace."""
        return max(self.windows) + self.grace

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "secrets"]

    @classmethod
    def load(
        cls,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        config_file: str | None = None,
    ) -> Settings:
        """Merge the sources (flags win) and validate; ConfigError says what is wrong."""
        environ = environ or {}
        values: dict[str, Any] = {}
        path = config_file or environ.get(ENV_PREFIX + "CONFIG")
        if path:
            try:
                with open(path, "rb") as stream:
                    document = tomllib.load(stream)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"cannot read config file {path}: {exc}") from None
            values.update(document.get("stream_ndcg", document))
        for name in cls.names():
            if ENV_PREFIX + name.upper() in environ:
                values[name] = environ[ENV_PREFIX + name.upper()]
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        unknown = set(values) - set(cls.names())
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        coerced = {name: _COERCE.get(name, str)(value) for name, value in values.items()}
        try:
            return replace(cls(), **coerced)
        except TypeError as exc:
            raise ConfigError(str(exc)) from None

    def secret_values(self) -> list[str]:
        """The secrets themselves, for log redaction (their repr too: byte strings get logged)."""
        values = [self.sasl_password, urlsplit(self.redis_url).password or ""]
        return [form for value in values if value for form in (value, repr(value.encode())[2:-1])]

    def kafka_client_options(self) -> dict[str, Any]:
        """Connection and security options shared by every Kafka client of the service."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers.split(","),
                                   "security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL"):
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password)
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, name):
                options[name] = getattr(self, name)
        return options

    def masked(self) -> dict[str, Any]:
        """The effective settings for people to read, with credentials replaced by '***'."""
        shown: dict[str, Any] = {}
        for name in self.names():
            value = getattr(self, name)
            if name in self.secrets:
                value = mask_url(value) if name.endswith("_url") else ("***" if value else "")
            elif name in ("windows", "bucket", "grace", "judgment_ttl", "linger", "max_future"):
                value = [format_duration(v) for v in value] if isinstance(value, tuple) else format_duration(value)
            shown[name] = list(value) if isinstance(value, tuple) else value
        return shown


def mask_url(url: str) -> str:
    """redis://user:secret@host -> redis://user:***@host."""
    parts = urlsplit(url)
    if parts.password is None and "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}" if user else f"***@{host}"))
