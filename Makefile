# One entry point. `make sweep` runs the main job, `make test` runs the tests, `make lint` runs
# ruff (lint and format check) and mypy (pyproject.toml configures both); all set up
# .venv first from constraints.txt (torch 2.14.1 / torchvision 0.29.1 are pinned there).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup sweep test test-slow test-containers lint bench stage-data deploy setup-promtool clean distclean

$(STAMP): pyproject.toml constraints.txt tests/tools/install_kustomize.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=25" "uv==0.13.9"
	# uv installs the same pinned set as pip (constraints.txt; `pip freeze` identical) in a quarter of the time: 50 s
	# against 184 s for a fresh venv here, most of it torch's CUDA wheels (parallel downloads and unpacking). It trusts
	# the system's certificates as pip does here; should it fail (a proxy it cannot use), pip installs the same set.
	$(BIN)/uv pip install -q --system-certs --python $(BIN)/python -c constraints.txt -e ".[test]" || { \
	  echo "make setup: uv could not install the project; pip installs it instead (slower)" >&2; \
	  $(BIN)/python -m pip install -q -c constraints.txt -e ".[test]"; }
	# Reference library for the metric parity tests (its PyPI metadata needs pip < 24.1).
	-$(BIN)/python tests/reference/fetch_uncertainty_metrics.py --quiet
	# kustomize 5.6.0 for the deploy tests' rendering: Debian's package, pinned by hash, to $(BIN)/kustomize.
	# Not fatal: if the archive drops that file the rest of the set-up stands, and the deploy tests fall back to a
	# kustomize or kubectl on PATH or fail in one line naming the installer.
	-$(BIN)/python tests/tools/install_kustomize.py
	touch $(STAMP)

setup: $(STAMP)

# promtool for the alert rules' tests (tests/unit/deploy/test_alerts.py): Debian's prometheus package (needs root; .ci/run
# does the same). Not part of `setup`, which needs no root.
setup-promtool:
	command -v promtool >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

sweep: setup
	$(BIN)/python sweeps/launch.py $(ARGS)

# The unit tier, two test files at a time (CI's unit stage took 10:38 on one core of its two; each file's fixtures
# stay in one worker, so a module's shared set-up runs once).
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=10 --junitxml=build/junit-unit.xml $(ARGS)

# Whole sweeps, two test files at a time (each file's fixtures stay in one worker); the 25 longest tests are listed
# (CI's slow tier took 15 min in one run and 40 min in the next: the list says where the time goes).
test-slow: setup
	$(BIN)/python -m pytest -q -m slow -n 2 --dist loadfile --no-loadscope-reorder --durations=25 --junitxml=build/junit-slow.xml $(ARGS)

# The images built and run with podman (installed and configured by tests/containers/setup_podman.sh,
# which needs root): stand-in bases, docker/ unchanged, the MLflow stack and a Ray cluster from the
# rendered dev overlay. Minutes on a cold machine (the project image holds torch's CUDA wheels).
# Two files at a time (pytest-xdist workers, each with its own stack: tests/containers/fixtures.py): the tier waits on
# containers more than it computes.
test-containers: setup
	bash tests/containers/setup_podman.sh
	$(BIN)/python -m pytest -q -m container -n 2 --dist loadfile --durations=15 --junitxml=build/junit-containers.xml $(ARGS)

# Every check runs (the import contracts between sweeps/' layers too), and the target fails if any found something.
lint: setup
	@rc=0; $(BIN)/ruff check . || rc=1; $(BIN)/ruff format --check . || rc=1; $(BIN)/mypy || rc=1; \
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit/test_import_contracts.py || rc=1; exit $$rc

# Stage a torchvision dataset into the object store for the cluster (deploy/README.md, "Stage the datasets"), from a
# machine with internet access: make stage-data DATASET=cifar10 DEST=s3://calib-sweeps-ray-results/datasets
stage-data: setup
	@test -n "$(DATASET)" -a -n "$(DEST)" || { echo "stage-data: set DATASET (e.g. cifar10) and DEST (s3://bucket/datasets)" >&2; exit 2; }
	$(BIN)/python -m calib_core.data.stage stage $(DATASET) $(DEST) --root $(or $(ROOT),data) $(ARGS)

# The README's deploy step (deploy/README.md, "4. Deploy"): render OVERLAY with every check, refuse placeholder digests
# and address ranges and a change to a running sweep's RayJob, name each Job after its spec, then kubectl apply -f -.
#   make deploy OVERLAY=deploy/overlays/gpu-cluster [ARGS="-l app.kubernetes.io/name!=calib-sweep"]
deploy: setup
	@test -n "$(OVERLAY)" || { echo "deploy: set OVERLAY (e.g. deploy/overlays/gpu-cluster)" >&2; exit 2; }
	$(BIN)/python deploy/release.py apply $(OVERLAY) $(ARGS)

bench: setup
	$(BIN)/python -m benchmarks.perf.bench_metrics

# Everything the demo and the tests write here (stores, artifacts, Ray results, caches); `distclean` also the venv.
clean:
	rm -rf .pytest_cache .ruff_cache .mypy_cache .hypothesis mlruns mlflow.db optuna.db mlartifacts ray_results test-artifacts

distclean: clean
	rm -rf $(VENV)
