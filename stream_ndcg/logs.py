"""How the services log: text or JSON lines, with every configured secret redacted."""

from __future__ import annotations

import json
import logging

from stream_ndcg.config import Settings


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message (and the exception's trace)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class Redact(logging.Filter):
    """Replaces every configured secret in a log record by '***', whoever logs it: at DEBUG,
    kafka-python logs the SASL PLAIN exchange, password included."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(secret in message for secret in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, "***")
            record.msg, record.args = message, None
        return True


def configure_logging(settings: Settings) -> None:
    """The services' logging: text or JSON lines (`log_format`) at `log_level`, every configured
    secret redacted, kafka-python's reconnect noise quieted."""
    handler = logging.StreamHandler()
    handler.addFilter(Redact(settings.secret_values()))
    handler.setFormatter(JsonFormatter() if settings.log_format == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    # kafka-python logs every reconnect attempt at WARNING/ERROR; the service says what matters itself.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if settings.log_level.upper() != "DEBUG" else logging.DEBUG)
