# gaudi-cluster: every target uses the project's virtual environment in .venv (make venv).
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo nogit)
IMAGE_NAME ?= gaudi-cluster
IMAGE_CPU ?= $(IMAGE_NAME):cpu
# The gaudi flavor's pin set (app/gaudi_cluster/settings/profiles.json): gaudi = Gaudi 2/3 on Synapse 1.24,
# gaudi-1.23 = Gaudi 2/3 one release behind, dl1 = first-gen Gaudi (AWS DL1, 1.21).
PROFILE ?= gaudi
# Habana's DeepSpeed fork: a full commit to install (default: the profile's, else the last build's pin file
# PINS_DIR/PROFILE.env, else the branch head that `git ls-remote HABANA_DEEPSPEED_REPO` resolves), and the
# fork's git URL (default: profiles.json facts.deepspeed_fork_repo; a local path or mirror works).
HABANA_DEEPSPEED_COMMIT ?=
HABANA_DEEPSPEED_REPO ?=
PINS_DIR ?= build/pins
# Stdlib only, so `make image` needs no venv on the build machine.
PROFILES := PYTHONPATH=app python3 -m gaudi_cluster.settings.profiles_cli
BASE_IMAGE_CPU ?= gaudi-cluster/debian:bookworm
NODES ?= 3
export GAUDI_CLUSTER_IMAGE ?= $(IMAGE_CPU)

.PHONY: help venv host-tools lint test test-quick test-unit test-train test-image test-cluster test-aws test-slurm test-k8s image \
        image-cpu image-gaudi image-dl1 image-gaudi-standin base-image wheelhouse keys demo up down logs bench clean ohabana-venv \
        test-ohabana

help: ## list the targets and the variables they read (make TARGET NAME=value)
	@grep -E '^[a-zA-Z0-9_.-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'
	@echo "variables (default; the comment above it in the Makefile):"
	@awk '/^#/ {note = note (note == "" ? "" : " ") substr($$0, 3); next} /^(export )?[A-Z][A-Z0-9_]* \?=/ {sub(/^export /, ""); \
		name = $$1; value = $$0; sub(/^[^=]*= */, "", value); \
		printf "  %-24s %-32s %s\n", name, (value == "" ? "(empty)" : value), note} {note = ""}' $(MAKEFILE_LIST)

$(VENV)/.installed: requirements/dev.txt pyproject.toml dev/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements/dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . -e dev
	touch $@

venv: $(VENV)/.installed ## create .venv with the pinned tools and the package (editable)

host-tools: ## the host tools the tests run (pdsh, OpenMPI, ssh, g++, debootstrap): installed as root, else the command
	scripts/host-tools.sh

lint: venv ## ruff, shellcheck, hadolint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck -x entrypoint/*.sh scripts/*.sh image/*.sh .ci/run bench/*.sh \
	  slurm/gaudi-cluster.sbatch tests/slurm/start-slurm.sh \
	  tests/cluster/hpu/hl-smi tests/cluster/hpu/fi_info tests/cluster/hpu/mpirun tests/cluster/hpu/*.sh \
	  tests/image/standin/*.sh tests/image/standin/mpirun
	$(VENV)/bin/hadolint Dockerfile examples/own-job/Dockerfile tests/slurm/Dockerfile tests/cluster/hpu/Dockerfile tests/image/standin/Dockerfile
	$(PROFILES) check

test-unit: venv host-tools ## pure unit tests (no Docker, no training)
	$(PY) -m pytest -q tests/unit

test-train: venv ## train the default model for real on 2 local CPU ranks
	$(PY) -m pytest -q tests/train

test-image: venv image-cpu image-gaudi-standin ## testinfra checks of the cpu image and the gaudi stand-in
	$(PY) -m pytest -q tests/image

test-cluster: venv image-cpu ## real multi-container clusters that train
	$(PY) -m pytest -q tests/cluster

test-aws: venv host-tools ## gaudi-cluster aws against moto (EC2/SSM emulator) and botocore's Stubber
	$(PY) -m pytest -q tests/aws

test-slurm: venv image-cpu ## a real Slurm 22.05 cluster in containers runs slurm/gaudi-cluster.sbatch
	$(PY) -m pytest -q -s --durations=0 tests/slurm

test-k8s: venv host-tools image-cpu ## k8s/ rendered and schema-checked offline, and its runtime contract with Docker
	$(PY) -m pytest -q tests/k8s

ohabana-venv: venv wheelhouse ## test-only venv with PROFILE's optimum-habana on CPU torch (build/ohabana-PROFILE)
	PYTHON=$(PY) scripts/make-ohabana-venv.sh $(PROFILE)

test-ohabana: venv wheelhouse ## the workload's GaudiTrainer branch on CPU through each profile's optimum-habana
	$(PY) -m pytest -q tests/ohabana

# No Docker, no image: the edit-test loop (about 2.5 minutes on 2 cores). The tests run on four
# pytest-xdist workers, two a core: many wait on a subprocess or a socket, so four keep both cores
# busy (the pure ones alone: 84 s, 1.74 cores; two workers took 107-123 s). tests/local's masters put
# their status sockets under tmp_path, so the workers' tmp_paths live under a short /tmp/gc.XXXXXX
# (xdist's default one is 10 characters longer and passed AF_UNIX's 108-byte limit). Measured warm:
# 160 s, against 89 s for the pure tests then 93 s for tests/local serially.
QUICK_TESTS := tests/unit tests/aws tests/k8s/test_manifests.py tests/k8s/test_hardening.py \
  tests/k8s/test_metrics_scrape.py tests/local
XDIST := -n 4 --dist loadgroup

test-quick: venv host-tools ## unit, in-process and offline k8s tests (no Docker), about 2.5 minutes
	base=$$(mktemp -d /tmp/gc.XXXXXX); $(PY) -m pytest -q $(XDIST) --basetemp="$$base" $(QUICK_TESTS); rm -rf "$$base"

# make test: the quick tests and tests/image (testinfra on the built images: one xdist group, so one
# worker and one set of its containers) on four workers first, then the Docker and training tests on
# two workers, one lane each (tests/conftest.py: GROUPS): the cluster tests that bound how fast a fault
# is named run one job at a time in the timed lane, as they did serially, and the trainings, Slurm and
# the Kubernetes contract fill the time it spends waiting on heartbeats and teardowns (serially that
# stage left about a third of the 2 cores idle: 1,159 s on 12-06). The first stage took 186 s warm
# against 260 s for the three parts one after another. tests/ohabana stays out of the first stage:
# beside three other workers one of its two-rank trainings aborted (SIGABRT, "terminate called
# without an active exception") once in two runs.
# The optimum-habana test venvs (pip installs from local wheels: about 80 s on a fresh clone) build
# beside the images, before any test: beside the pure tests they cost those 60 s. tests/ohabana then
# finds them up to date, or builds one itself and shows why it failed (logs: build/ohabana-PROFILE.log).
OHABANA_PROFILES := $(patsubst requirements/ohabana-%.txt,%,$(wildcard requirements/ohabana-*.txt))

test: venv host-tools wheelhouse ## all tests (builds the cpu image; needs a Docker engine)
	mkdir -p build; for profile in $(OHABANA_PROFILES); do \
	  PYTHON=$(PY) scripts/make-ohabana-venv.sh "$$profile" >"build/ohabana-$$profile.log" 2>&1 & done; \
	$(MAKE) image-cpu image-gaudi-standin; code=$$?; wait; exit $$code
	base=$$(mktemp -d /tmp/gc.XXXXXX); \
	$(PY) -m pytest -q $(XDIST) --basetemp="$$base" --durations=10 $(QUICK_TESTS) tests/image; rm -rf "$$base"
	base=$$(mktemp -d /tmp/gc.XXXXXX); $(PY) -m pytest -q -n 2 --dist loadgroup --basetemp="$$base" \
	  --durations=25 tests $(addprefix --ignore=,$(QUICK_TESTS) tests/image); rm -rf "$$base"

base-image: ## the Debian 12 base of the cpu flavor (pulled, or debootstrapped offline)
	scripts/make-base-image.sh $(BASE_IMAGE_CPU)

wheelhouse: venv ## download/build the cpu image's wheels on the host (build/wheelhouse)
	scripts/make-wheelhouse.sh

image-cpu: base-image wheelhouse ## build the cpu flavor (offline)
	scripts/build-image.sh $(IMAGE_CPU) -t $(IMAGE_NAME):$(VERSION)-cpu-$(GIT_REV) \
	  --build-arg FLAVOR=cpu --build-arg BASE_IMAGE=$(BASE_IMAGE_CPU) \
	  --build-arg VERSION=$(VERSION) --build-arg GIT_REV=$(GIT_REV)
	scripts/prune-builds.sh $(IMAGE_CPU) $(GIT_REV)

image: ## build the gaudi flavor of PROFILE (gaudi: Gaudi 2/3 on 1.24; gaudi-1.23; dl1: AWS DL1); needs vault.habana.ai; DRY_RUN=1 prints
	$(PROFILES) check
	if [[ "$${DRY_RUN:-0}" == 1 ]]; then \
	  $(PROFILES) docker-build $(PROFILE) --image-name $(IMAGE_NAME) --version $(VERSION) --git-rev $(GIT_REV) \
	    --deepspeed-commit "$(HABANA_DEEPSPEED_COMMIT)" --deepspeed-repo "$(HABANA_DEEPSPEED_REPO)" \
	    --pins-dir "$(PINS_DIR)" --dry-run; \
	else HABANA_DEEPSPEED_COMMIT="$(HABANA_DEEPSPEED_COMMIT)" HABANA_DEEPSPEED_REPO="$(HABANA_DEEPSPEED_REPO)" \
	  PINS_DIR="$(PINS_DIR)" scripts/build-gaudi-image.sh $(PROFILE) $(IMAGE_NAME) $(VERSION) $(GIT_REV); fi

# TEST-ONLY: the gaudi flavor's Dockerfile path built offline on a stand-in of the vault base
# (tests/image/standin); tests/image/test_gaudi_standin.py checks the result (gaudi-cluster-standin:gaudi).
# Measured on 2 shared cores: 230 s with only the stand-in base's Debian packages cached, 18 s warm.
image-gaudi-standin: base-image wheelhouse ## build the gaudi profile offline on a stand-in base (tests/image/standin)
	VERSION=$(VERSION) GIT_REV=$(GIT_REV) tests/image/standin/make-standin.sh

image-gaudi: ## make image PROFILE=gaudi (Gaudi 2 / Gaudi 3)
	$(MAKE) image PROFILE=gaudi

image-dl1: ## make image PROFILE=dl1 (first-gen Gaudi on AWS DL1, EFA)
	$(MAKE) image PROFILE=dl1

keys: ## make the cluster's ssh keys in .keys/ (git-ignored): host CA, client key, each node's certified host key (NAMES="node-1 node-2,10.0.0.2")
	NAMES="$(NAMES)" scripts/make-keys.sh .keys

demo: venv image-cpu keys ## train the bundled model across a master and two workers, then evaluate
	$(PY) -m gaudi_cluster_dev.localcluster demo --image $(IMAGE_CPU) --keys .keys

up: venv keys ## start a local simulated cluster with compose (NODES=3)
	scripts/compose.sh up $(NODES)

down: venv ## stop the local compose cluster
	scripts/compose.sh down

logs: venv ## follow the local compose cluster's logs
	scripts/compose.sh logs

bench: venv ## measure bring-up, overhead, failure detection, scale, throughput, image
	$(PY) -m bench

clean: ## remove build outputs (not the images)
	rm -rf build .pytest_cache .ruff_cache
