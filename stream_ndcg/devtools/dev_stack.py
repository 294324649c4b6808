"""`stream-ndcg dev up` and `dev down`: a detached broker and Redis that outlive the command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stream_ndcg.devtools.redis_servers import RedisClusterNodes, RedisServer
from stream_ndcg.devtools.servers import KafkaBroker, KafkaCluster, cache_dir, stop_process


def state_file() -> Path:
    return cache_dir() / "dev" / "state.json"


def dev_up(kafka_port: int | None, redis_port: int | None, *, redis_cluster: bool = False, brokers: int = 1,
           replicas: int = 0) -> dict[str, object]:
    """Start a detached Kafka (one broker, or a KRaft cluster of `brokers` voters) and Redis (one
    server, or a cluster of three masters with `replicas` replicas each) for `stream-ndcg dev up`;
    return their addresses and pids."""
    if state_file().exists():
        raise RuntimeError(f"already up ({state_file()}); run `stream-ndcg dev down` first")
    root = cache_dir() / "dev"
    # A fresh broker each time: the controller port is picked anew, and dev data is disposable.
    shutil.rmtree(root, ignore_errors=True)
    kafka = (KafkaBroker.start(root / "kafka", kafka_port, detach=True) if brokers == 1
             else KafkaCluster.start(root / "kafka", brokers, detach=True))
    try:
        if redis_cluster:
            nodes = RedisClusterNodes.start(root / "redis-cluster", replicas=replicas, detach=True).nodes
        else:
            nodes = [RedisServer.start(root / "redis", redis_port, detach=True)]
    except BaseException:
        kafka.stop()
        raise
    state: dict[str, object] = {"bootstrap_servers": kafka.bootstrap, "redis_url": nodes[0].url,
                                "redis_cluster": redis_cluster,
                                "kafka_pids": [node.pid for node in getattr(kafka, "nodes", [kafka])],
                                "redis_pids": [node.pid for node in nodes]}
    state_file().write_text(json.dumps(state))
    return state


def dev_down() -> bool:
    """Stop what `dev_up` started; False if nothing was up."""
    path = state_file()
    if not path.exists():
        return False
    state = json.loads(path.read_text())
    # `kafka_pid`: what a dev up of an earlier release wrote.
    for pid in [*state.get("kafka_pids", [state.get("kafka_pid")]), *state["redis_pids"]]:
        stop_process(None, pid=int(pid))
    path.unlink()
    return True
