"""Deprecated import path: the replay is `stream_ndcg.offline.replay`. Kept for one release."""

import warnings

from stream_ndcg.offline.replay import Replay, ScoredImpression
from stream_ndcg.offline.totals import ScoreTotals

__all__ = ["Replay", "ScoreTotals", "ScoredImpression"]

warnings.warn("stream_ndcg.replay is deprecated: import from stream_ndcg.offline.replay",
              DeprecationWarning, stacklevel=2)
