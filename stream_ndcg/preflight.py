"""`stream-ndcg check-config --connect`: reach Kafka and Redis as the service would, and say what is wrong.

Each check uses the service's own client options (`Settings.kafka_client_options`,
`state.redis_reads.connect`), so credentials, TLS and cluster mode are tried exactly as `run`
will use them, but gives up within seconds instead of backing off forever.

    problems = check(settings, report=print)
"""

from __future__ import annotations

from collections.abc import Callable

from kafka import KafkaAdminClient
from kafka.errors import KafkaError, for_code
from redis.exceptions import RedisClusterException, RedisError

from stream_ndcg.config import Settings
from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.setting_values import mask_url
from stream_ndcg.state.redis_reads import connect

# Long enough for a TLS and SASL handshake across a region, short enough for a person waiting.
TIMEOUT_MS = 8_000


def check(settings: Settings, report: Callable[[str], None]) -> list[str]:
    """Report what was reached; return the problems, one sentence each (none: all is well)."""
    return check_kafka(settings, report) + check_redis(settings, report)


def check_kafka(settings: Settings, report: Callable[[str], None]) -> list[str]:
    try:
        admin = KafkaAdminClient(**settings.kafka_client_options(), client_id="stream-ndcg-check-config",
                                 request_timeout_ms=TIMEOUT_MS, bootstrap_timeout_ms=TIMEOUT_MS)
    except (KafkaError, OSError) as exc:
        return [f"Kafka unreachable at {settings.bootstrap_servers} with security_protocol="
                f"{settings.security_protocol}: {type(exc).__name__}: {exc} (check bootstrap_servers, "
                "the network path and the credentials)"]
    problems: list[str] = []
    try:
        report(f"kafka: reached {settings.bootstrap_servers} ({settings.security_protocol})")
        wanted = [*settings.topics, *([settings.dead_letter_topic] if settings.dead_letter_topic else [])]
        for topic in admin.describe_topics(wanted):
            name = topic["name"]
            role = "dead-letter topic" if name == settings.dead_letter_topic else "topic"
            if topic["error_code"]:
                error = for_code(topic["error_code"]).__name__
                problems.append(f"Kafka {role} {name!r}: {error} (create it, or grant this user access to it)")
            else:
                report(f"kafka: {role} {name}: {len(topic['partitions'])} partitions")
    except (KafkaError, OSError) as exc:
        problems.append(f"Kafka metadata request failed: {type(exc).__name__}: {exc}")
    finally:
        admin.close()
    return problems


def check_redis(settings: Settings, report: Callable[[str], None]) -> list[str]:
    where = mask_url(settings.redis_url)
    try:
        client = connect(settings.redis_url, cluster=settings.redis_cluster, ca_file=settings.redis_ca_file)
        try:
            client.ping()
            version = client.info("server").get("redis_version", "?") if not settings.redis_cluster else "cluster"
        finally:
            client.close()
    except (RedisError, RedisClusterException, StoreUnavailable, OSError) as exc:
        return [f"Redis unreachable at {where}: {type(exc).__name__}: {exc} (check redis_url, its "
                "user:password and, for rediss://, redis_ca_file)"]
    report(f"redis: reached {where} ({version})")
    return []
