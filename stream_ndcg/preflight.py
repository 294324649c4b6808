"""`stream-ndcg check-config --connect`: reach Kafka and Redis as the service would, and say what is wrong.

Each check uses the service's own client options (`Settings.kafka_client_options`,
`state.redis_reads.connect`), so credentials, TLS and cluster mode are tried exactly as `run`
will use them, but gives up within seconds instead of backing off forever.

    problems = check(settings, report=print)
"""

from __future__ import annotations

from collections.abc import Callable

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
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
        replicas: dict[str, int] = {}
        for topic in admin.describe_topics(wanted):
            name = topic["name"]
            role = "dead-letter topic" if name == settings.dead_letter_topic else "topic"
            if topic["error_code"]:
                error = for_code(topic["error_code"]).__name__
                problems.append(f"Kafka {role} {name!r}: {error} (create it, or grant this user access to it)")
            else:
                replicas[name] = min(len(p["replica_nodes"]) for p in topic["partitions"])
                report(f"kafka: {role} {name}: {len(topic['partitions'])} partitions, {replicas[name]} replicas")
        if settings.dead_letter_topic in replicas and len(replicas) > 1:
            for warning in dead_letter_durability(admin, settings.dead_letter_topic, replicas):
                report(f"kafka: warning: {warning}")
    except (KafkaError, OSError) as exc:
        problems.append(f"Kafka metadata request failed: {type(exc).__name__}: {exc}")
    finally:
        admin.close()
    return problems


def dead_letter_durability(admin: KafkaAdminClient, dead_letters: str, replicas: dict[str, int]) -> list[str]:
    """What makes the dead-letter topic less durable than the input topics: fewer replicas, or a lower
    min.insync.replicas (a topic setting; the producer already waits for all in-sync replicas). A
    rejected message counts as consumed once it is acknowledged there: a weaker topic can lose it."""
    insync = min_insync_replicas(admin, list(replicas))
    inputs = [name for name in replicas if name != dead_letters]
    warnings = []
    input_replicas = max(replicas[name] for name in inputs)
    if replicas[dead_letters] < input_replicas:
        warnings.append(f"dead-letter topic {dead_letters} has {replicas[dead_letters]} replicas, fewer than the "
                        f"input topics' {input_replicas}: a rejected message it acknowledged can be lost with "
                        "one broker")
    strictest = max(insync.get(name, 1) for name in inputs)
    if insync.get(dead_letters, 1) < strictest:
        warnings.append(f"dead-letter topic {dead_letters} has min.insync.replicas={insync.get(dead_letters, 1)}, "
                        f"lower than the input topics' {strictest}: raise it (kafka-configs --alter "
                        f"--entity-type topics --entity-name {dead_letters} --add-config min.insync.replicas="
                        f"{strictest})")
    return warnings


def min_insync_replicas(admin: KafkaAdminClient, topics: list[str]) -> dict[str, int]:
    """Each topic's effective min.insync.replicas (its own, or the brokers' default)."""
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs=None)
                                        for name in topics], config_filter="all")
    found: dict[str, int] = {}
    for name, configs in described.get("topic", {}).items():
        value = configs.get("min.insync.replicas", {}).get("value")
        if value is not None:
            found[name] = int(value)
    return found


def check_redis(settings: Settings, report: Callable[[str], None]) -> list[str]:
    where = mask_url(settings.redis_url)
    try:
        client = connect(settings.redis_url, cluster=settings.redis_cluster, ca_file=settings.redis_ca_file,
                         sentinels=settings.redis_sentinels, master=settings.redis_sentinel_master)
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
