# One entry point for people and CI: every target creates what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv lint docs test test-unit test-pure test-integration test-deploy test-browser test-fuzz test-simulation chaos \
	bench demo clean helm checkov manifests

# Helm and checkov are tools of the tests, cached outside the repository (like the Kafka jars).
CACHE ?= $(or $(STREAM_NDCG_CACHE),$(HOME)/.cache/stream-ndcg)
GO ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
HELM_VERSION := v3.20.2
HELM := $(CACHE)/helm-$(HELM_VERSION)/helm
CHECKOV_VERSION := 3.3.30
CHECKOV := $(CACHE)/checkov-$(CHECKOV_VERSION)/bin/checkov
export HELM CHECKOV

venv: $(STAMP)

# The modules setup.py compiles with mypyc and from C (stream_ndcg/core_build.py's COMPILED_MODULES
# and NATIVE_MODULES; a unit test checks that the lists agree): an edit to one of them rebuilds the
# compiled core, which would otherwise not run (an import compares each source with the digest its
# build recorded).
CORE_MODULES := vocabulary metric window_sums list_squares group_sums stored_lists list_terms rows windows engine
NATIVE_MODULES := squares_kernel
CORE_SOURCES := $(patsubst %,stream_ndcg/%.py,$(CORE_MODULES)) $(patsubst %,stream_ndcg/%.c,$(NATIVE_MODULES))

$(STAMP): pyproject.toml setup.py $(CORE_SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check stream_ndcg tests bench setup.py
	$(BIN)/mypy
	$(BIN)/mypy bench

# The manual (docs/, mkdocs.yml) into site/ (ignored by git); --strict fails on a broken link or anchor.
# NO_MKDOCS_2_WARNING quiets mkdocs-material's notice about its end of life, printed on every build.
SITE := site
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d $(SITE)

# Helm from its Go module (no distribution package has it); about two minutes, once.
helm: $(HELM)
$(HELM):
	GOBIN=$(dir $(HELM)) GOFLAGS=-mod=mod GOTOOLCHAIN=auto $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# checkov in a venv of its own: its pins clash with the dev extras.
checkov: $(CHECKOV)
$(CHECKOV):
	$(PYTHON) -m venv $(CACHE)/checkov-$(CHECKOV_VERSION)
	$(CACHE)/checkov-$(CHECKOV_VERSION)/bin/pip install --quiet checkov==$(CHECKOV_VERSION)

# The plain manifests, rules file and dashboard of deploy/, rendered from the chart.
manifests: venv helm
	$(BIN)/python deploy/render.py

# The test tiers, a folder each (tests/conftest.py says what each needs). Unit first: hermetic and
# about a minute, so that its failure stops the run before the servers start; then every other
# tier, each run even if one before it failed (-k), and the run fails if any did. `-m "not slow"`
# leaves the long chaos run to `make chaos`; the simulation tier has its own target (minutes of CPU).
# PYTEST_ARGS adds options: make test-unit PYTEST_ARGS=-x
PYTEST_ARGS ?=
# Each tier ends with its slowest tests (--durations), so that a run that grows says where.
# pytest exits 5 when it collected nothing (a -k in PYTEST_ARGS that matches no test of a tier): not a failure.
define pytest_tier
$(BIN)/pytest -m "not slow" -rA --durations=15 --durations-min=5 $(PYTEST_ARGS) $(1); status=$$?; [ $$status -eq 5 ] || exit $$status
endef

test: lint docs
	$(MAKE) test-unit
	$(MAKE) test-pure
	$(MAKE) -k test-integration test-deploy test-browser test-fuzz

test-unit: venv
	$(call pytest_tier,tests/unit)

# The pure-Python core, the reference, where `make venv` compiled it: the tests of the compiled modules
# against the replay, trec_eval and ranx again with STREAM_NDCG_PURE=1, which loads their sources.
PURE_TESTS := $(patsubst %,tests/unit/test_%.py,differential properties moments list_squares group_sums metric \
	metric_sums window_sums windows core_build compact_format)
test-pure: venv
	STREAM_NDCG_PURE=1 $(call pytest_tier,$(PURE_TESTS))

# Against a real Kafka and Redis, started by the session fixtures; several minutes. Helm renders
# the chart whose rules and dashboard test_prometheus runs against a real Prometheus.
test-integration: venv helm
	$(call pytest_tier,tests/integration)

test-deploy: venv helm checkov
	$(call pytest_tier,tests/deploy)

# The page's tests on a canned API and on a running service (so a Kafka and a Redis too).
test-browser: venv
	$(call pytest_tier,tests/browser)

test-fuzz: venv
	$(call pytest_tier,tests/fuzz)

# Simulated A/B streams watched every minute for a day: the comparisons' false alarms and time to
# decide (issue #29); a few minutes of CPU, -s prints the figures.
test-simulation: venv
	$(BIN)/pytest -m simulation -s -rA tests/simulation

# The long chaos runs (tests marked slow): one broker and one Redis, then three KRaft nodes and a
# Redis Cluster with replicas (500,000 events, 60 faults); about an hour, see docs/reliability.md.
chaos: venv
	$(BIN)/pytest -m slow -s tests

# Against a real local Kafka and Redis; several minutes. Results go to bench/RESULTS.md (their figures
# to bench/RESULTS.json); bench.targets, last, checks issue #30's targets against those figures.
bench: venv
	$(BIN)/python -m bench.replay_bench
	$(BIN)/python -m bench.service_bench
	$(BIN)/python -m bench.latency_bench
	$(BIN)/python -m bench.memory_bench
	$(BIN)/python -m bench.profile_bench --native --after 300000 --seconds 20
	$(BIN)/python -m bench.api_bench
	$(BIN)/python -m bench.scrape_bench
	$(BIN)/python -m bench.dedup_bench
	$(BIN)/python -m bench.state_bench
	$(BIN)/python -m bench.commit_cpu_bench
	$(BIN)/python -m bench.steady_bench
	$(BIN)/python -m bench.wait_bench
	$(BIN)/python -m bench.versions_bench
	$(BIN)/python -m bench.squares_bench
	$(BIN)/python -m bench.core_bench
	$(BIN)/python -m bench.upkeep_bench
	$(BIN)/python -m bench.cache_bench
	$(BIN)/python -m bench.cache_sizes_bench
	$(BIN)/python -m bench.decode_bench
	$(BIN)/python -m bench.judge_bench
	$(BIN)/python -m bench.targets

# The main job locally: Kafka, Redis, the service and live simulated traffic; Ctrl-C stops all of it.
demo: venv
	$(BIN)/stream-ndcg demo

clean:
	rm -rf $(VENV) $(SITE) .mypy_cache .pytest_cache .ruff_cache
