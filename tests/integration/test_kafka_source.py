"""`KafkaSource` on a real broker: a member alone in its group is assigned its partitions once."""

from __future__ import annotations

import time
import uuid

import pytest

from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.source.base import Partition
from stream_ndcg.source.kafka import KafkaSource, consumer_options, new_consumer
from tests.support.topics import create_topic
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka]

# kafka-python's metadata update comes about half a second after subscribing, and a member that
# joined before it rejoins then: the wait covers it.
SETTLE_S = 3.0


@pytest.mark.parametrize("attempt", range(3))
def test_a_member_alone_in_its_group_keeps_its_first_assignment(kafka: KafkaBroker, attempt: int) -> None:
    # On a broker that has served other groups (this session's), the first join comes at once:
    # without `subscribe`'s metadata refresh an attempt rejoins about seven times in eight.
    topic = create_topic(kafka.bootstrap)
    options = consumer_options({"bootstrap_servers": kafka.bootstrap}, group_id=f"once-{uuid.uuid4().hex[:10]}",
                               auto_offset_reset="earliest", batch_size=10, max_message_bytes=1_000_000)
    source = KafkaSource(lambda: new_consumer(options))
    source.open()
    try:
        assert source.missing_topics([topic]) == []
        source.subscribe([topic])
        # A fresh broker has no group coordinator for a moment: the poll says so, and is tried again.
        wait_until(lambda: source.poll(50, 10) == {} and source.assignment() == {Partition(topic, 0)}, 30,
                   f"{topic}:0 assigned", ignoring=(BrokerUnavailable,))
        settled = time.monotonic() + SETTLE_S
        while time.monotonic() < settled:
            source.poll(50, 10)
        assert source.revoked() == set()
        assert source.assignment() == {Partition(topic, 0)}
    finally:
        source.close()
