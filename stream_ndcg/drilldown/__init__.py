"""The investigation slice: the per-query index (`index`), the judging queue (`queue`), the
questions answered from a store (`explorer`), the HTTP API (`api`) and the page (`page/`)."""
