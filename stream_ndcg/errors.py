"""The exception tree of stream-ndcg.

    StreamNdcgError                 root: catch this to catch them all
    ├── ConfigError                 settings that cannot work; raised at start-up, fatal
    ├── RecoverableError            the world is broken for now: back off, retry, never exit
    │   ├── StoreUnavailable        Redis cannot be reached or failed mid-command
    │   ├── BrokerUnavailable       Kafka cannot be reached
    │   ├── ConsumerStalled         Kafka has records for us, the consumer returns none: rejoin
    │   └── UndecodableRecords      a batch compressed with a codec this install cannot decompress
    ├── FencedError                 another instance claimed the partition: drop it, do not write
    └── RequestError                a drill-down question that cannot be answered as asked
        ├── BadParameter            a parameter is malformed or names nothing configured (HTTP 400)
        └── NotFound                nothing is held for what was asked (HTTP 404)

Bad input is not an exception: `events.parse_event` returns an `InvalidEvent`,
which is counted and skipped (data, not an incident).
"""

from __future__ import annotations


class StreamNdcgError(Exception):
    """The root of every error stream-ndcg raises on purpose."""


class ConfigError(StreamNdcgError):
    """The settings cannot work; say which and why."""


class RecoverableError(StreamNdcgError):
    """A transient fault of a dependency: retry with backoff."""


class StoreUnavailable(RecoverableError):
    """Redis is unreachable or failed mid-command."""


class BrokerUnavailable(RecoverableError):
    """Kafka is unreachable."""


class ConsumerStalled(RecoverableError):
    """The consumer returns no records for partitions that have some (a kafka-python 3.0 fault
    after some rebalances, dpkp/kafka-python#3131): only a new consumer recovers."""


class UndecodableRecords(RecoverableError):
    """The Kafka client cannot decompress a batch: its codec's library is not installed.

    The partition cannot advance past the batch until the library is installed and the
    service restarted; the batch is never skipped, since that would lose its events.
    `topic`, `partition` and `offset` (of the first record not read) are None when the
    client does not tell them.
    """

    def __init__(self, codec: str, topic: str | None, partition: int | None, offset: int | None,
                 remedy: str) -> None:
        where = (f"{topic}:{partition} at offset {offset}" if topic is not None
                 else "a partition the Kafka client did not name")
        super().__init__(f"cannot decode the records of {where}: compressed with {codec}, "
                         f"which this installation cannot decompress ({remedy})")
        self.codec = codec
        self.topic = topic
        self.partition = partition
        self.offset = offset


class FencedError(StreamNdcgError):
    """A newer holder claimed the partition; this instance must not write to it."""


class RequestError(StreamNdcgError):
    """A drill-down question that cannot be answered as asked; the message starts with the parameter."""

    status = 400

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"{parameter}: {problem}")
        self.parameter = parameter


class BadParameter(RequestError):
    """A parameter is malformed, out of range, or names something not configured."""


class NotFound(RequestError):
    """Nothing is held for what was asked."""

    status = 404
