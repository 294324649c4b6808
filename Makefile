# One entry point for people and CI: every target creates what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv lint test test-unit chaos bench demo clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check stream_ndcg tests bench
	$(BIN)/mypy
	$(BIN)/mypy bench

# Unit tests, the integration tests against a real Kafka and Redis, and a short chaos run.
test: lint
	$(BIN)/pytest -m "not slow" -rA tests

test-unit: venv
	$(BIN)/pytest tests/unit

chaos: venv
	$(BIN)/pytest -m slow -s tests

# Against a real local Kafka and Redis; several minutes. Results go to bench/RESULTS.md.
bench: venv
	$(BIN)/python -m bench.replay_bench
	$(BIN)/python -m bench.service_bench

# The main job locally: Kafka, Redis, the service and live simulated traffic; Ctrl-C stops all of it.
demo: venv
	$(BIN)/stream-ndcg demo

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
