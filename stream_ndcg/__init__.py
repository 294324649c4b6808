"""stream-ndcg: DCG and nDCG@k of search rankings, computed as judgments stream in."""

__version__ = "0.1.0"
