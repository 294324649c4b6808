"""How a setting's text becomes its value: the parsers behind `config.setting`, each of which
also checks the value and says, in words a person can act on, what is wrong with it.

    >>> parse_duration_ms("5m"), format_duration(3_600_000)
    (300000, '1h')
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from stream_ndcg.errors import ConfigError
from stream_ndcg.experiments import Experiment, parse_experiments
from stream_ndcg.metric import Measure
from stream_ndcg.vocabulary import SOURCE_NAME, SOURCE_RULE

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = {"pipeline", "k", "window", "type", "reason", "le", "partition", "topic", "job", "instance"}
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(?::(\d+))?$")
NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]+$")
_DURATION_EXAMPLES = "examples: 500ms, 30s, 5m, 1h, 7d"


class Bad(ValueError):
    """A parser's complaint about a value, completed with the setting's name and source."""


def parse_duration_ms(text: str | int) -> int:
    """'5m' -> 300000; a bare integer is milliseconds."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ConfigError(f"{text!r} is not a duration: it is negative ({_DURATION_EXAMPLES})")
        return text
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", str(text)) if isinstance(text, str) else None
    if not match:
        raise ConfigError(f"{text!r} is not a duration ({_DURATION_EXAMPLES})")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def csv(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value if str(v).strip())
    if not isinstance(value, str):
        raise Bad(f"{value!r} is not a comma-separated list")
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse_cutoffs(value: Any) -> tuple[int, ...]:
    """The cut-offs k of a setting, a flag or a TOML array: '5,10' or [5, 10], checked as `Measure` checks them."""
    try:
        return cutoffs(value)
    except Bad as exc:
        raise ConfigError(f"k: {exc}") from None


def cutoffs(value: Any) -> tuple[int, ...]:
    try:
        cutoffs = tuple(integer_value(v) for v in csv(value))
    except Bad:
        raise Bad(f"{value!r} is not a comma-separated list of integers (example: 5,10)") from None
    try:
        Measure(cutoffs=cutoffs)
    except ValueError as exc:
        raise Bad(str(exc)) from None
    return cutoffs


def integer_value(value: Any) -> int:
    # bool is an int to Python and 9464.5 truncates to one: TOML's `true` must not become port 1.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise Bad(f"{value!r} is not an integer")


def integer(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        number = integer_value(value)
        if number < minimum or (maximum is not None and number > maximum):
            bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise Bad(f"{number} is out of range: it must be {bounds}")
        return number
    return parse


def duration(minimum_ms: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise Bad(f"{value!r} is not a duration ({_DURATION_EXAMPLES})")
        try:
            ms = parse_duration_ms(value)
        except ConfigError as exc:
            raise Bad(str(exc)) from None
        if ms < minimum_ms:
            raise Bad(f"{value!r} is too short: it must be at least {format_duration(minimum_ms)}")
        return ms
    return parse


def durations(value: Any) -> tuple[int, ...]:
    parse = duration(1)
    windows = tuple(parse(v) for v in csv(value))
    if not windows:
        raise Bad(f"{value!r} holds no duration: give at least one ({_DURATION_EXAMPLES})")
    if len(set(windows)) != len(windows):
        raise Bad(f"{value!r} names a duration twice: windows must be distinct")
    return windows


def thresholds(value: Any) -> tuple[float, ...]:
    """Three ascending scores, not negative ('0.5,1,2'), or none at all (the model's own)."""
    try:
        numbers = tuple(float(v) for v in csv(value))
    except (Bad, ValueError):
        raise Bad(f"{value!r} is not a comma-separated list of numbers (example: 0.5,1,2)") from None
    if numbers and (len(numbers) != 3 or not 0 <= numbers[0] <= numbers[1] <= numbers[2] < float("inf")):
        raise Bad(f"{value!r}: give three ascending scores, not negative (the bounds of grades 0, 1 and 2)")
    return numbers


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise Bad(f"{value!r} is not a boolean (true or false)")


def as_text(value: Any) -> str:
    if not isinstance(value, str):
        raise Bad(f"{value!r} is not a string (quote it in a TOML file)")
    return value


def word(value: Any) -> str:
    text = as_text(value).strip()
    if not text or any(c.isspace() for c in text):
        raise Bad(f"{value!r} must be one word, without spaces")
    return text


def choice(*options: str, fold: bool = False) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = as_text(value).strip()
        if fold:
            text = text.upper()
        if text not in options:
            allowed = ", ".join(repr(o) if not o else o for o in options)
            raise Bad(f"{value!r} is not one of {allowed}")
        return text
    return parse


def fraction(value: Any) -> float:
    """A probability strictly between 0 and 1 (an alpha)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Bad(f"{value!r} is not a number") from None
    if isinstance(value, bool) or not 0.0 < number < 1.0:
        raise Bad(f"{value!r} must be between 0 and 1, both excluded")
    return number


def segment_value(value: Any) -> str:
    """A segment label's value as label=value, or '' for none."""
    text = as_text(value).strip()
    label, equals, wanted = text.partition("=")
    if text and (not equals or not label.strip() or not wanted.strip()):
        raise Bad(f"{value!r} is not label=value (e.g. variant=A)")
    return f"{label.strip()}={wanted.strip()}" if text else ""


def experiments(value: Any) -> tuple[Experiment, ...]:
    """Experiments as `experiments.parse_experiments` reads them."""
    try:
        return parse_experiments(value)
    except ValueError as exc:
        raise Bad(str(exc)) from None


def topic(value: Any) -> str:
    text = as_text(value).strip()
    if text and not _TOPIC.match(text):
        raise Bad(f"{value!r} is not a Kafka topic name (letters, digits, '.', '_', '-', up to 249)")
    return text


def topics(value: Any) -> tuple[str, ...]:
    topics = csv(value)
    if not topics:
        raise Bad("no topic: at least one is needed")
    for topic in topics:
        if not _TOPIC.match(topic):
            raise Bad(f"{topic!r} is not a Kafka topic name (letters, digits, '.', '_', '-', up to 249)")
    if len(set(topics)) != len(topics):
        raise Bad(f"{value!r} names a topic twice")
    return topics


def servers(value: Any, example: str = "kafka-0:9092,kafka-1:9092") -> str:
    servers = csv(value)
    if not servers:
        raise Bad("no broker: give host:port, comma-separated")
    for server in servers:
        match = _HOST_PORT.match(server)
        if not match or (match.group(2) is not None and not 0 < int(match.group(2)) < 65536):
            raise Bad(f"{server!r} is not host:port (example: {example})")
    return ",".join(servers)


def sentinels(value: Any) -> str:
    """Redis Sentinel addresses, as `servers`; empty for none."""
    return servers(value, "sentinel-0:26379,sentinel-1:26379") if csv(value) else ""


def redis_url(value: Any) -> str:
    url = as_text(value).strip()
    shown = mask_url(url)
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise Bad(f"{shown!r} must start with redis://, rediss:// or unix://")
    if parts.scheme == "unix":
        if not parts.path:
            raise Bad(f"{shown!r} names no socket path (example: unix:///run/redis.sock)")
        return url
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not parts.hostname or port == -1:
        raise Bad(f"{shown!r} is not redis://[user:password@]host[:port][/db] (example: redis://redis:6379/0)")
    if not re.fullmatch(r"/?|/\d+", parts.path):
        raise Bad(f"{shown!r}: the database {parts.path.lstrip('/')!r} is not a number")
    return url


def labels(value: Any) -> tuple[str, ...]:
    labels = csv(value)
    for label in labels:
        if not _LABEL.match(label) or label in _RESERVED_LABELS:
            raise Bad(f"{label!r} is not a usable Prometheus label name (letters, digits, '_'; not one of "
                       f"{', '.join(sorted(_RESERVED_LABELS))})")
    if len(set(labels)) != len(labels):
        raise Bad(f"{value!r} names a label twice")
    return labels


def judgment_sources(value: Any) -> tuple[str, ...]:
    """Judgment sources, first first: 'raters,coec' or ["raters", "coec"]."""
    sources = csv(value)
    if not sources:
        raise Bad("at least one judgment source is needed")
    for source in sources:
        if not SOURCE_NAME.fullmatch(source):
            raise Bad(f"{source!r} is not a judgment source name ({SOURCE_RULE})")
    if len(set(sources)) != len(sources):
        raise Bad(f"{value!r} names a source twice")
    return sources


def namespace(value: Any) -> str:
    text = as_text(value).strip()
    if text and not NAMESPACE.match(text):
        raise Bad(f"{value!r} may hold letters, digits, '_', '.' and '-' only")
    return text


def mask_url(url: str) -> str:
    """redis://user:secret@host -> redis://user:***@host."""
    parts = urlsplit(url)
    if parts.password is None and "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}" if user else f"***@{host}"))
