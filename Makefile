# Forkbox: build, demo, test and benchmark entry points.
#
#   make demo    a local node with its own Redis runs sample jobs and prints their results
#   make test    everything CI checks: formatting, lints, Rust, Python and deployment tests
#   make bench   the side-by-side benchmark report (docs/benchmarks.md)

SHELL := /bin/bash
CARGO ?= cargo
PY_VENV ?= .venv
PY := $(PY_VENV)/bin/python
# The shared workloads live beside the repository; CI may clone elsewhere on the same machine.
FORKBOX_HUMANEVAL ?= $(abspath $(firstword $(wildcard ../shared/data/HumanEval.jsonl.gz /work/shared/data/HumanEval.jsonl.gz)))
export FORKBOX_HUMANEVAL
DEBIAN_PACKAGES := libseccomp-dev pkg-config redis-server redis-tools iproute2 python3-venv util-linux bubblewrap

.PHONY: all deps build release demo test test-rust test-python test-deploy lint bench clean

all: build

# System packages: installed when missing and root, otherwise the exact command is printed.
deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    (apt-get install -y $$missing || (apt-get update && apt-get install -y $$missing)) >/dev/null; \
	  else \
	    echo "missing system packages; run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust from https://rustup.rs"; exit 1; }

build: deps
	$(CARGO) build --workspace

release: deps
	$(CARGO) build --release -p forkbox

demo: release
	./target/release/forkbox up --own-redis --demo

$(PY_VENV)/.forkbox-sdk: sdk/python/pyproject.toml
	python3 -m venv $(PY_VENV)
	$(PY) -m pip install -q -e 'sdk/python[test,progress]'
	touch $@

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust: deps $(PY_VENV)/.forkbox-sdk
	$(CARGO) build --workspace
	FORKBOX_PYTHON=$(abspath $(PY)) FORKBOX_LOADGEN_REQUIRE_WORKER=1 \
	  $(CARGO) test --workspace -- --test-threads=2 --show-output

test-python: deps $(PY_VENV)/.forkbox-sdk
	$(CARGO) build -p forkbox
	$(PY) -m pytest -q sdk/python/tests
	$(PY) -m pytest -q bench/tests

test-deploy: deps
	$(CARGO) build -p forkbox
	FORKBOX_BIN=$(abspath target/debug/forkbox) bash tests/deploy/run.sh

test: lint test-rust test-python test-deploy
	@echo "make test: all suites passed"

bench: deps $(PY_VENV)/.forkbox-sdk
	bash bench/run.sh

clean:
	$(CARGO) clean
	rm -rf $(PY_VENV) bench/.venv bench/out
