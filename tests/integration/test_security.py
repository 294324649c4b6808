"""Security against real servers: Kafka SASL (SCRAM and PLAIN), Redis ACL and TLS, no secret in any output."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer, TlsFiles
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.security import REDIS_PASSWORD, SERVICE_ACL
from tests.support.service import Service, wait_for_messages
from tests.support.topics import create_topic
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

KAFKA_PASSWORD = "kafka-Secret-4711"


@pytest.fixture
def sasl_kafka(tmp_path: Path) -> Iterator[KafkaBroker]:
    with KafkaBroker.start(tmp_path / "sasl-kafka", sasl_users={"alice": KAFKA_PASSWORD}) as broker:
        yield broker


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it."""
    d = tmp_path / "tls"
    d.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.cnf", "-out", "server.crt")
    return TlsFiles(ca=d / "ca.crt", cert=d / "server.crt", key=d / "server.key")


def authenticated(logs: str, broker: KafkaBroker, mechanism: str) -> list[str]:
    """kafka-python's lines (logged at DEBUG) saying a connection to the broker's SASL listener
    authenticated as alice with `mechanism`."""
    said = {"PLAIN": "Plain"}.get(mechanism, mechanism)
    return [line for line in logs.splitlines()
            if f"127.0.0.1:{broker.sasl_port}<-" in line and f"Authenticated as alice via SASL / {said}" in line]


def refused(broker: KafkaBroker, mechanism: str) -> list[str]:
    """The broker's log lines saying it refused a client on its SASL listener for wrong credentials."""
    log = (broker.workdir / "server.log").read_text(errors="replace")
    return [line for line in log.splitlines()
            if "Failed authentication with /127.0.0.1" in line and f"channelId=127.0.0.1:{broker.sasl_port}-" in line
            and f"invalid credentials with SASL mechanism {mechanism}" in line]


def auth_refusals(admin: redis.Redis, user: str) -> int:
    """How many times Redis refused `user`'s password, from its ACL LOG."""
    entries: list[dict[str, Any]] = admin.acl_log()
    return sum(int(e["count"]) for e in entries if e["username"] == user and e["reason"] == "auth")


def traffic() -> list[tuple[bytes, bytes]]:
    return list(Simulator(SimulationSpec(events=2_000, seed=23, queries=50, rate=100.0)).messages())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_kafka_sasl(sasl_kafka: KafkaBroker, redis_server: RedisServer, service_env: dict[str, str],
                    services: list[Service], tmp_path: Path, mechanism: str) -> None:
    topic = create_topic(sasl_kafka.bootstrap, partitions=2)
    messages = traffic()
    produce(sasl_kafka.sasl_bootstrap, topic, messages, security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password=KAFKA_PASSWORD)
    env = dict(service_env, STREAM_NDCG_BOOTSTRAP_SERVERS=sasl_kafka.sasl_bootstrap, STREAM_NDCG_TOPICS=topic,
               STREAM_NDCG_SECURITY_PROTOCOL="SASL_PLAINTEXT", STREAM_NDCG_SASL_MECHANISM=mechanism,
               STREAM_NDCG_SASL_USERNAME="alice", STREAM_NDCG_SASL_PASSWORD=KAFKA_PASSWORD,
               STREAM_NDCG_LOG_LEVEL="DEBUG")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    wait_for_messages(service, len(messages))
    assert service.stop() == 0
    logs = service.logs()
    # The situation the test is about: the service read through the SASL listener, and authenticated there
    # as alice with this mechanism (the client says so once the broker has accepted the handshake).
    said = sorted({line.partition(">: ")[2] for line in logs.splitlines() if "Authenticated as" in line})
    assert authenticated(logs, sasl_kafka, mechanism), f"no {mechanism} authentication; the client said {said}"
    assert KAFKA_PASSWORD not in logs


def test_a_wrong_kafka_password_is_reported_without_the_password(
        sasl_kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(sasl_kafka.bootstrap)
    wrong = "not-the-Password-99"
    env = dict(service_env, STREAM_NDCG_BOOTSTRAP_SERVERS=sasl_kafka.sasl_bootstrap, STREAM_NDCG_TOPICS=topic,
               STREAM_NDCG_SECURITY_PROTOCOL="SASL_PLAINTEXT", STREAM_NDCG_SASL_MECHANISM="SCRAM-SHA-256",
               STREAM_NDCG_SASL_USERNAME="alice", STREAM_NDCG_SASL_PASSWORD=wrong, STREAM_NDCG_LOG_LEVEL="DEBUG")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    # The broker refused the service's handshake, and again when it retried. The service says why once a
    # refusal's answer reaches it: the broker may close the connection before its answer is read (seen on a
    # loaded machine, where the client logs only "socket disconnected"), so the retries are waited for.
    reason = "invalid credentials with SASL mechanism SCRAM-SHA-256"
    wait_until(lambda: len(refused(sasl_kafka, "SCRAM-SHA-256")) >= 2 and reason in service.logs(), 90,
               lambda: f"the broker refusing the wrong password twice, and the service saying why\n"
                       f"{service.logs()[-3000:]}")
    assert service.process is not None and service.process.poll() is None, "a transient fault must not end it"
    assert not service.ready()
    service.stop()
    logs = service.logs()
    assert not authenticated(logs, sasl_kafka, "SCRAM-SHA-256")
    assert wrong not in logs


def test_redis_acl_user_over_tls(kafka: KafkaBroker, tls_files: TlsFiles, service_env: dict[str, str],
                                 services: list[Service], tmp_path: Path) -> None:
    with RedisServer.start(tmp_path / "tls-redis", tls=tls_files) as server:
        admin = redis.Redis.from_url(server.url, ssl_ca_certs=str(tls_files.ca))
        admin.acl_setuser("sndcg", reset=True)
        admin.execute_command("ACL", "SETUSER", "sndcg", *SERVICE_ACL)  # type: ignore[no-untyped-call]
        admin.close()
        topic = create_topic(kafka.bootstrap, partitions=2)
        messages = traffic()
        half = len(messages) // 2
        produce(kafka.bootstrap, topic, messages[:half])
        url = f"rediss://sndcg:{REDIS_PASSWORD}@127.0.0.1:{server.port}/0"
        env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_REDIS_URL=url,
                   STREAM_NDCG_REDIS_CA_FILE=str(tls_files.ca), STREAM_NDCG_LOG_LEVEL="DEBUG")
        service = Service(env, tmp_path)
        services.append(service)
        service.start()
        wait_for_messages(service, half)
        # Connected over TLS (the server has no other port) as the ACL user.
        admin = redis.Redis.from_url(server.url, ssl_ca_certs=str(tls_files.ca))
        assert "sndcg" in {client["user"] for client in admin.client_list()}
        admin.close()
        # The drill-down's reads, and (once it reads) the row log its commits write, within the ACL.
        assert service.api("/api/v1/queries?window=1h")[0] == 200
        produce(kafka.bootstrap, topic, messages[half:])
        samples = wait_for_messages(service, len(messages))
        status, answer = service.api("/api/v1/queries?window=1h&limit=1000")
        assert status == 200 and answer["total"] > 0
        assert ("stream_ndcg_scrape_errors_total", ()) not in samples or \
            samples[("stream_ndcg_scrape_errors_total", ())] == 0
        assert service.stop() == 0
        assert REDIS_PASSWORD not in service.logs()
        # The ACL really is narrow: a command the service never needs is refused.
        limited = redis.Redis.from_url(url, ssl_ca_certs=str(tls_files.ca))
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.flushall()
        limited.close()


def test_wrong_redis_password_and_check_config_never_show_secrets(
        kafka: KafkaBroker, redis_server: RedisServer, service_env: dict[str, str], services: list[Service],
        tmp_path: Path) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    admin.execute_command("ACL", "SETUSER", "locked", *SERVICE_ACL)  # type: ignore[no-untyped-call]
    admin.close()
    wrong = "wrong-Redis-Password-42"
    url = f"redis://locked:{wrong}@127.0.0.1:{redis_server.port}/0"
    env = dict(service_env, STREAM_NDCG_TOPICS=create_topic(kafka.bootstrap), STREAM_NDCG_REDIS_URL=url,
               STREAM_NDCG_SASL_PASSWORD=KAFKA_PASSWORD, STREAM_NDCG_LOG_LEVEL="DEBUG")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    # Redis refused the service's password, and again when it retried.
    admin = redis.Redis.from_url(redis_server.url)
    wait_until(lambda: auth_refusals(admin, "locked") >= 2, 60,
               lambda: f"Redis refusing the wrong password twice\n{service.logs()[-3000:]}")
    admin.close()
    assert service.process is not None and service.process.poll() is None
    assert not service.ready()
    body = "".join(f"{k} {v}" for k, v in service.scrape().items())
    service.stop()
    logs = service.logs()
    assert "WRONGPASS" in logs or "invalid username-password" in logs or "AuthenticationError" in logs, logs[-2000:]
    for secret in (wrong, KAFKA_PASSWORD):
        assert secret not in logs
        assert secret not in body
    shown = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", "check-config"],
                           env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    assert wrong not in shown.stdout + shown.stderr
    assert KAFKA_PASSWORD not in shown.stdout + shown.stderr
    assert "locked:***@" in shown.stdout
