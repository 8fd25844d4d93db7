# Polymorph developer entry points. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv test test-fast lint typecheck unit demo e2e demo-fleet bench crds clean prometheus control-plane go-tools images

venv: $(DEV_STAMP)

# The operator and e2e tests scrape with the real Prometheus server (Debian's package, 2.42).
prometheus:
	@command -v prometheus >/dev/null || { apt-get update -qq && apt-get install -y -qq prometheus; }

# The real Kubernetes control plane the tests start (tests/support/control_plane.py): etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler built from the Go module proxy
# (tests/tools/control-plane), once, into the test cache outside the repository.
control-plane:
	PYTHONPATH=tests $(PYTHON) -m support.control_plane_build

# The Go test tools (tests/tools: the real kstatus library, Argo CD's Lua runtime), built once into
# the same cache; a test that needs one builds it if this has not (tests/support/go_tools.py).
go-tools:
	PYTHONPATH=tests $(PYTHON) -m support.go_tools

# Two install levels: what running Polymorph needs (make demo), and the test tooling on top.
# .ci/constraints.txt pins every dependency to the versions CI last passed with: installs are
# reproducible and pip's resolver has nothing to backtrack over.
$(RUN_STAMP): pyproject.toml .ci/constraints.txt
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
unit: venv prometheus control-plane go-tools
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
e2e: venv prometheus control-plane go-tools
	$(BIN)/pytest -q e2e

# The same scenario, narrated for a person to watch; ends with kubectl get md,cj.polymorph.dev,deploy,jobs,pods.
demo-fleet: venv prometheus control-plane go-tools
	PYTHONPATH=tests:e2e $(BIN)/python e2e/demo_fleet.py

bench: $(RUN_STAMP)
	$(BIN)/python bench/hot_vs_cold.py --model tiny --json

# The two images (README "Images"), named as the chart's defaults name them: this repository's
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
