"""stream-ndcg: DCG and nDCG@k of search rankings, computed as judgments stream in."""

import os

from stream_ndcg.core_build import select

__version__ = "0.1.0"

# Before any module of the pure core is imported: its compiled build, or its Python sources.
select(os.environ)
