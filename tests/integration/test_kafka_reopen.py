"""A Kafka consumer the service could not make, because no broker answered, leaves nothing running:
kafka-python 3.0.12 starts a consumer's IO thread before it asks the brokers for their versions,
and a constructor that then raised left that thread reconnecting for good, holding the client,
its sockets and its metrics, one more at each of the loop's attempts (`source.kafka.new_consumer`)."""

from __future__ import annotations

import gc
import logging
import threading
import uuid
from typing import Any

import pytest
from kafka.metrics import KafkaMetric

from stream_ndcg.devtools.ports import LOOPBACK, free_port
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.source.kafka import KafkaSource, consumer_options, new_consumer
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka]

FAILED_OPENS = 3


def io_threads(client_id: str) -> int:
    return sum(thread.name == f"kafka-io-{client_id}" for thread in threading.enumerate())


def metrics_of(client_id: str) -> int:
    return sum(isinstance(o, KafkaMetric) and o.metric_name.tags.get("client-id") == client_id
               for o in gc.get_objects())


def test_consumers_made_while_no_broker_answers_leave_no_thread_nor_metrics(kafka: KafkaBroker,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    topic = create_topic(kafka.bootstrap)
    options = consumer_options({}, group_id=f"reopen-{uuid.uuid4().hex[:10]}", auto_offset_reset="earliest",
                               batch_size=10, max_message_bytes=1_000_000)
    client_id = options["client_id"]
    # Kafka down (nothing listens on that port) at the first attempts, then up.
    down: dict[str, Any] = {"bootstrap_servers": f"{LOOPBACK}:{free_port()}", "bootstrap_timeout_ms": 300}
    attempts = iter([down] * FAILED_OPENS + [{"bootstrap_servers": kafka.bootstrap}])
    source = KafkaSource(lambda: new_consumer({**options, **next(attempts)}))
    # Nothing of pytest's may keep a consumer's objects: the log records it captures keep their
    # arguments (kafka-python logs its connections); and garbage is collected only where this test
    # asks, as a collection that finds the socket of a refused connection unclosed (pyproject.toml's
    # filterwarnings) hands pytest a ResourceWarning whose traceback keeps the frames running then,
    # and with them whichever consumer was being made.
    caplog.set_level(logging.CRITICAL, logger="kafka")
    gc.disable()
    try:
        for _ in range(FAILED_OPENS):
            with pytest.raises(BrokerUnavailable):
                source.open()
        source.open()
        assert source.missing_topics([topic]) == []
        # What is counted below, seen on the consumer that was made: its thread and its metrics.
        assert io_threads(client_id) >= 1
        assert metrics_of(client_id) > 0
        source.close()
    finally:
        gc.enable()

    gc.collect()
    assert io_threads(client_id) == 0
    assert metrics_of(client_id) == 0
