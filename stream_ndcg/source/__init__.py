"""Where records come from: the `Source` interface (`base`), its in-memory twin (`local`) and the
kafka-python adapter (`kafka`, imported by name only: the interface does not need a Kafka client).

    from stream_ndcg.source import LocalSource, Partition
"""

from stream_ndcg.source.base import Partition, Record, Source, StartFrom
from stream_ndcg.source.local import LocalRecord, LocalSource

__all__ = ["LocalRecord", "LocalSource", "Partition", "Record", "Source", "StartFrom"]
