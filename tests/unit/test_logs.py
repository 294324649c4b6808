"""The services' logging: secrets redacted whoever logs them, JSON lines that parse."""

from __future__ import annotations

import json
import logging

from stream_ndcg.logs import JsonFormatter, Redact


def _record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("kafka.conn", logging.DEBUG, __file__, 1, message, args, None)


def test_every_configured_secret_is_redacted_from_the_message_and_its_arguments() -> None:
    record = _record("SASL PLAIN exchange for %s with %s", "alice", "s3cret-pw")
    assert Redact(["s3cret-pw", "", "tok-123"]).filter(record)
    assert record.getMessage() == "SASL PLAIN exchange for alice with ***"


def test_a_message_without_a_secret_is_left_as_it_is() -> None:
    record = _record("connected to %s", "127.0.0.1:9092")
    Redact(["s3cret-pw"]).filter(record)
    assert (record.msg, record.args) == ("connected to %s", ("127.0.0.1:9092",))


def test_json_lines_carry_level_logger_and_the_formatted_message() -> None:
    entry = json.loads(JsonFormatter().format(_record("lag %d on %s", 3, "events-0")))
    assert (entry["level"], entry["logger"], entry["message"]) == ("DEBUG", "kafka.conn", "lag 3 on events-0")
