# fleetscope: `make demo` runs the product on the embedded default; `make test` passes the tests.
# Both create .venv and install what they need; a second run is fast (install is stamped).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= test,bench

.PHONY: install demo test test-fast bench lint clean help

help:
	@echo "make demo   - set up and run fleetscope on the embedded store (chDB + SQLite)"
	@echo "make test   - set up and run the whole test suite (starts PostgreSQL if needed)"
	@echo "make bench  - run the benchmarks in bench/ (each prints a side-by-side ratio)"
	@echo "make clean  - remove .venv and ./data"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e '.[$(EXTRAS)]'
	@touch $@

install: $(STAMP)

demo: install
	$(BIN)/fleetscope migrate
	$(BIN)/fleetscope migrate --status

test: install
	scripts/ensure-postgres.sh
	$(BIN)/pytest

bench: install
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) data
