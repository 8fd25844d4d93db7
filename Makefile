# Polymorph developer entry points. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv test test-fast lint typecheck unit demo e2e demo-fleet bench crds clean system-packages go-version \
	control-plane go-tools images

venv: $(DEV_STAMP)

# The system packages the tests run, Debian's: the real Prometheus server and its promtool (the
# operator and e2e tests scrape with it, promtool checks the chart's alert rules; 2.42), headless
# Chromium (a test opens a campaign's report.html, e2e/dashboard.py draws the dashboard) and tmux
# (a test looks at a `kubectl polymorph get -w` screen). A package is installed with apt only when
# its commands are missing; without root or apt-get, one sentence says which and how.
system-packages:
	@has() { for name in "$$@"; do command -v "$$name" >/dev/null && return 0; done; return 1; }; \
	missing=; \
	has prometheus && has promtool || missing="$$missing prometheus"; \
	has chromium chromium-browser || missing="$$missing chromium"; \
	has tmux || missing="$$missing tmux"; \
	missing=$${missing# }; \
	[ -n "$$missing" ] || exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "The tests need Debian's packages $$missing, not installed here: run \`sudo apt-get install -y $$missing\` (or your system's equivalent), then make again." >&2; \
	  exit 1; \
	fi; \
	echo "apt-get install $$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	{ apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; } || \
	  { echo "apt-get could not install $$missing (its error is above)." >&2; exit 1; }

# Go builds the control plane and the Go test tools, at least the release that the `go` line of
# tests/tools/control-plane/go.mod names (Kubernetes v1.36 needs 1.26). Found as the tests find
# it: on PATH, else /usr/local/go/bin/go. GOTOOLCHAIN=local: go never downloads another toolchain.
GO_NEEDED := $(shell sed -n 's/^go //p' tests/tools/control-plane/go.mod)
export GOTOOLCHAIN := local
go-version:
	@go=$$(command -v go || echo /usr/local/go/bin/go); \
	found=$$("$$go" env GOVERSION 2>/dev/null | sed -n 's/^go//p'); \
	[ -n "$$found" ] && printf '%s\n' $(GO_NEEDED) "$$found" | sort -C -V && exit 0; \
	if [ -n "$$found" ]; then have="$$go is Go $$found"; else have="no go is on PATH"; fi; \
	echo "The tests' Go tools need Go $(GO_NEEDED) or later (tests/tools/control-plane/go.mod), and $$have: see https://go.dev/doc/install." >&2; \
	exit 1

# The real Kubernetes control plane the tests start (tests/support/control_plane.py): etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler built from the Go module proxy
# (tests/tools/control-plane), once, into the test cache outside the repository.
control-plane: go-version
	PYTHONPATH=tests $(PYTHON) -m support.control_plane_build

# The Go test tools (tests/tools: the real kstatus library, Argo CD's Lua runtime), built once into
# the same cache; a test that needs one builds it if this has not (tests/support/go_tools.py).
go-tools: go-version
	PYTHONPATH=tests $(PYTHON) -m support.go_tools

# Two install levels: what running Polymorph needs (make demo), and the test tooling on top.
# .ci/constraints.txt pins every dependency to the versions CI last passed with: installs are
# reproducible and pip's resolver has nothing to backtrack over.
$(RUN_STAMP): pyproject.toml .ci/constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "Polymorph needs Python 3.11 or later, and $(PYTHON) is $$($(PYTHON) --version 2>/dev/null || echo not found): run make with PYTHON=python3.11 (make PYTHON=python3.11 test)." >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: PyPI has only its CUDA build (a few GB, it runs on the CPU); pip keeps the
	# wheel in its cache (~/.cache/pip), so a second venv installs it without the download.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c .ci/constraints.txt -e '.[engine,agent]'
	touch $(RUN_STAMP)

$(DEV_STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -c .ci/constraints.txt -e '.[engine,agent,dev]'
	touch $(DEV_STAMP)

# lint-imports checks the layer contracts in pyproject.toml ([tool.importlinter]): the trust
# boundary between polymorph and polymorph_engine, and the layers inside the engine.
lint: venv
	$(BIN)/ruff check operator engine_image tests e2e bench
	$(BIN)/ruff format --check operator engine_image tests e2e bench
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

# tests/ and e2e/ in one run on both cores: pytest-xdist runs test files on PYTEST_WORKERS
# processes (a file's tests stay on one, so module-scoped servers start once), longest first as
# tests/durations.json has them (tests/conftest.py orders them; --no-loadscope-reorder keeps that
# order). Three workers on two cores: a third of the suite's time is spent waiting on servers (the
# operator's intervals, Prometheus' scrapes, the control plane), and the third worker computes
# meanwhile. The e2e fleet loop, the longest file, starts first: its canary analysis compares the
# canary pods' decode speed with the stable pods' on the same cores, so the tests beside it slow
# both tracks alike. --durations lists the slowest tests.
PYTEST_WORKERS ?= 3
unit: venv system-packages control-plane go-tools
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests e2e

# The unit and core tests alone (the API and its rules, the operator's pure core, statistics, the
# store, workloads): under a minute, for the edit-test loop. make test runs everything.
test-fast: venv
	$(BIN)/pytest -q -n 2 tests/api tests/core tests/stats tests/store tests/workload

test: lint typecheck unit
	$(BIN)/polymorph crds --check

demo: $(RUN_STAMP)
	$(BIN)/polymorph compile

# The whole loop (e2e/README.md): the real control plane, kubectl, helm, operator, engines, Prometheus, S3 (moto).
e2e: venv system-packages control-plane go-tools
	$(BIN)/pytest -q e2e

# The same scenario, narrated for a person to watch; ends with kubectl get md,cj.polymorph.dev,deploy,jobs,pods.
demo-fleet: venv system-packages control-plane go-tools
	PYTHONPATH=tests:e2e $(BIN)/python e2e/demo_fleet.py

bench: $(RUN_STAMP)
	$(BIN)/python bench/hot_vs_cold.py --model tiny --json

# The two images (docs/images.md), named as the chart's defaults name them: this repository's
# operator and engine, tagged with the chart's appVersion. IMAGE_REGISTRY and IMAGE_TAG override;
# DOCKER_BUILD_ARGS passes more to each build (e.g. --build-arg BASE_IMAGE=...).
IMAGE_REGISTRY ?= ghcr.io/polymorph
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *//p' charts/polymorph/Chart.yaml | tr -d '"')
images:
	docker build -f operator/Dockerfile -t $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG) $(DOCKER_BUILD_ARGS) .
	docker build -f engine_image/Dockerfile -t $(IMAGE_REGISTRY)/engine:$(IMAGE_TAG) $(DOCKER_BUILD_ARGS) .

crds: venv
	$(BIN)/polymorph crds --output crds --output charts/polymorph/crds

clean:
	rm -rf $(VENV) .polymorph .mypy_cache .ruff_cache .pytest_cache
