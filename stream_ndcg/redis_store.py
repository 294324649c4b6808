"""Deprecated import path: `RedisStore` is `stream_ndcg.state.redis`'s, `connect`
`stream_ndcg.state.redis_reads`'. Kept for one release."""

import warnings

from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect

__all__ = ["RedisStore", "connect"]

warnings.warn("stream_ndcg.redis_store is deprecated: import RedisStore from stream_ndcg.state.redis",
              DeprecationWarning, stacklevel=2)
