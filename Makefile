# Forkbox: build, demo, test and benchmark entry points.
#
#   make demo    a local node with its own Redis runs sample jobs and prints their results
#   make test    everything CI checks: formatting, lints, Rust, Python and deployment tests
#                (the gateway's suite drives the judge0, sandbox-fusion and piston-client
#                libraries), and the VM tier (cgroup v2 limits on a real kernel under qemu)
#   make test-vm the VM tier alone
#   make bench   the side-by-side benchmark report (docs/benchmarks.md): forkbox-bench and
#                forkbox-loadgen against the peer systems, all in one run

SHELL := /bin/bash
CARGO ?= cargo
PY_VENV ?= .venv
PY := $(PY_VENV)/bin/python
# The shared workloads live beside the repository; CI may clone elsewhere on the same machine.
FORKBOX_HUMANEVAL ?= $(abspath $(firstword $(wildcard ../shared/data/HumanEval.jsonl.gz /work/shared/data/HumanEval.jsonl.gz)))
export FORKBOX_HUMANEVAL
# Each suite's output is kept here so `make test` can count and list what was skipped.
TEST_LOGS := target/test-logs
DEBIAN_PACKAGES := libseccomp-dev pkg-config redis-server redis-tools iproute2 python3-venv util-linux bubblewrap openssl
# The language runtimes the limit tests run at the default limits (node may come from another
# repository's `nodejs`; the JDK from `openjdk-*-jdk-headless`, which the default one depends on).
RUNTIME_PACKAGES := nodejs default-jdk-headless golang-go ruby erlang-base gcc g++ perl lua5.4 node-typescript
# numpy, for the warm runtime's heavier-preload test (numpy's generator reseeded per job) and
# its benchmark.
WARM_PACKAGES := python3-numpy
# The VM tier: qemu, the kernel it boots and the busybox virtme-ng's init needs.
VM_PACKAGES := qemu-system-x86 linux-image-amd64 busybox-static
VM_VENV ?= .venv-vm
VIRTME_NG_VERSION ?= 1.42
# The HTTP clients the gateway's suite drives unchanged (tests/gateway); where one cannot be
# installed, its reason goes to $(GATEWAY_CLIENTS)/<name>.missing and its tests skip with it.
GATEWAY_CLIENTS := target/gateway-clients
JUDGE0_CLIENT_VERSION ?= 0.0.8
SANDBOX_FUSION_VERSION ?= 0.3.7
PISTON_CLIENT_VERSION ?= 1.0.2
# The agent frameworks of sdk/python/examples/session_*.py: sdk/python/pyproject.toml's `agents` extra.
AGENT_CLIENTS := target/agent-clients

# Installs the Debian packages named in $(1) that are missing when root; otherwise prints the
# exact command and fails.
define apt_install
missing=""; for p in $(1); do \
  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ]; then \
    echo "installing:$$missing"; \
    (DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing || \
      (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing)) >/dev/null; \
  else \
    echo "missing system packages; run: sudo apt-get install -y --no-install-recommends$$missing"; exit 1; \
  fi; \
fi
endef

.PHONY: all deps deps-vm build release demo gateway-clients agent-clients test test-logs test-rust test-python test-deploy test-vm lint bench clean

all: build

# System packages: installed when missing and root, otherwise the exact command is printed.
deps:
	@$(call apt_install,$(DEBIAN_PACKAGES) $(RUNTIME_PACKAGES) $(WARM_PACKAGES))
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust from https://rustup.rs"; exit 1; }

# What the VM tier needs. Without root and with something missing, the command is printed and
# the tier reports itself skipped.
deps-vm:
	@($(call apt_install,$(VM_PACKAGES))) || true
	@$(MAKE) --no-print-directory $(VM_VENV)/bin/vng

$(VM_VENV)/bin/vng:
	python3 -m venv $(VM_VENV)
	$(VM_VENV)/bin/pip install -q 'virtme-ng==$(VIRTME_NG_VERSION)'

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

# The judge0 and sandbox-fusion Python clients (into the test venv) and npm's piston-client.
gateway-clients: $(PY_VENV)/.forkbox-sdk
	@mkdir -p $(GATEWAY_CLIENTS)
	@rm -f $(GATEWAY_CLIENTS)/*.missing
	@for spec in judge0==$(JUDGE0_CLIENT_VERSION) sandbox-fusion==$(SANDBOX_FUSION_VERSION); do \
	  name=$${spec%%==*}; \
	  $(PY) -m pip install -q "$$spec" >$(GATEWAY_CLIENTS)/$$name.log 2>&1 || \
	    { echo "pip install $$spec failed: $$(tail -n 3 $(GATEWAY_CLIENTS)/$$name.log | tr '\n' ' ')" >$(GATEWAY_CLIENTS)/$$name.missing; \
	      echo "gateway-clients: $$spec not installed (its tests will skip)"; }; \
	done
	@if ! command -v npm >/dev/null && command -v node >/dev/null; then ($(call apt_install,npm)) || true; fi
	@if ! command -v npm >/dev/null; then \
	  echo "npm is not installed (apt-get install npm), so piston-client could not be" >$(GATEWAY_CLIENTS)/piston-client.missing; \
	elif [ ! -f $(GATEWAY_CLIENTS)/node_modules/piston-client/index.js ]; then \
	  npm install --prefix $(GATEWAY_CLIENTS) --no-audit --no-fund piston-client@$(PISTON_CLIENT_VERSION) >$(GATEWAY_CLIENTS)/piston-client.log 2>&1 || \
	    { echo "npm install piston-client@$(PISTON_CLIENT_VERSION) failed: $$(tail -n 3 $(GATEWAY_CLIENTS)/piston-client.log | tr '\n' ' ')" >$(GATEWAY_CLIENTS)/piston-client.missing; \
	      echo "gateway-clients: piston-client not installed (its tests will skip)"; }; \
	fi

# The agent frameworks of the session examples (the SDK's `agents` extra, pinned there), each
# on its own: one that cannot be installed is named in $(AGENT_CLIENTS)/<name>.missing and its
# test skips with that reason.
agent-clients: $(PY_VENV)/.forkbox-sdk
	@mkdir -p $(AGENT_CLIENTS)
	@rm -f $(AGENT_CLIENTS)/*.missing
	@for spec in $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("sdk/python/pyproject.toml", "rb"))["project"]["optional-dependencies"]["agents"]))'); do \
	  name=$${spec%%==*}; \
	  $(PY) -m pip install -q "$$spec" >$(AGENT_CLIENTS)/$$name.log 2>&1 || \
	    { echo "pip install $$spec failed: $$(tail -n 3 $(AGENT_CLIENTS)/$$name.log | tr '\n' ' ')" >$(AGENT_CLIENTS)/$$name.missing; \
	      echo "agent-clients: $$spec not installed (its example test will skip)"; }; \
	done

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-logs:
	@rm -rf $(TEST_LOGS) && mkdir -p $(TEST_LOGS)

# The isolation suites run twice: with the default network (none), then with loopback.
test-rust: deps $(PY_VENV)/.forkbox-sdk
	$(CARGO) build --workspace
	@mkdir -p $(TEST_LOGS)
	set -o pipefail; FORKBOX_PYTHON=$(abspath $(PY)) FORKBOX_LOADGEN_REQUIRE_WORKER=1 FORKBOX_REQUIRE_RUNTIMES=1 \
	  $(CARGO) test --workspace -- --test-threads=2 --show-output 2>&1 | tee $(TEST_LOGS)/rust.log
	set -o pipefail; FORKBOX_NETWORK_DEFAULT=loopback FORKBOX_PYTHON=$(abspath $(PY)) FORKBOX_REQUIRE_RUNTIMES=1 \
	  $(CARGO) test -p forkbox \
	  --test sandbox --test sandbox_kernel_state --test warm_python -- --test-threads=2 2>&1 | tee $(TEST_LOGS)/rust-loopback.log

test-python: deps $(PY_VENV)/.forkbox-sdk gateway-clients agent-clients
	$(CARGO) build -p forkbox
	$(CARGO) build -p forkbox-queue --example noop_worker
	@mkdir -p $(TEST_LOGS)
	set -o pipefail; $(PY) -m pytest -q -rs sdk/python/tests 2>&1 | tee $(TEST_LOGS)/python-sdk.log
	set -o pipefail; $(PY) -m pytest -q -rs bench/tests 2>&1 | tee $(TEST_LOGS)/python-bench.log
	set -o pipefail; FORKBOX_BIN=$(abspath target/debug/forkbox) FORKBOX_GATEWAY_CLIENTS=$(abspath $(GATEWAY_CLIENTS)) \
	  $(PY) -m pytest -q -rs tests/gateway 2>&1 | tee $(TEST_LOGS)/python-gateway.log

test-deploy: deps
	$(CARGO) build -p forkbox
	@mkdir -p $(TEST_LOGS)
	set -o pipefail; FORKBOX_BIN=$(abspath target/debug/forkbox) bash tests/deploy/run.sh 2>&1 | tee $(TEST_LOGS)/deploy.log

# The cgroup v2 limits on a real kernel: one qemu boot runs the cgroup tests, the runtime
# matrix and the isolation suite in both network modes (tests/vm/run.sh; its plan's format is
# checked first by tests/vm/plan_test.sh). It is bounded by FORKBOX_VM_TIMEOUT and prints
# `SKIPPED: <reason>` only where qemu cannot run here; its status is the last line of `make test`.
test-vm: deps deps-vm
	bash tests/vm/plan_test.sh
	$(CARGO) build -p forkbox
	@mkdir -p $(TEST_LOGS)
	set -o pipefail; FORKBOX_VM_VENV=$(abspath $(VM_VENV)) bash tests/vm/run.sh 2>&1 | tee $(TEST_LOGS)/vm.log

# Every suite prints `SKIPPED: <reason>` (pytest: `SKIPPED [n] ...`) for what this host cannot
# run; FORKBOX_REQUIRE_PRIVILEGED=1 makes such a skip a failure instead.
test: test-logs lint test-rust test-python test-deploy test-vm
	@bash tests/skips.sh $(TEST_LOGS)
	@echo "make test: all suites passed; VM tier: $$(cat target/vm-tier.status 2>/dev/null || echo 'not run')"

bench: deps $(PY_VENV)/.forkbox-sdk
	bash bench/run.sh

clean:
	$(CARGO) clean
	rm -rf $(PY_VENV) $(VM_VENV) bench/.venv bench/out
