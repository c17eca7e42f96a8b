# `make test` and `make bench` each set up .venv from nothing (or refresh it) and then run.
# The CPU build of torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup test bench bench-full report clean perf

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest

bench: setup
	$(VENV)/bin/flowzoo bench quick --runs runs --report reports/quick

# one Flow-GRPO iteration of ours against the released-style loop (ratio, phase split, gradient check); PERF_ARGS
# e.g. "--device cuda --model-path DIR reuse_rollout_graph=true"
perf: setup
	$(VENV)/bin/flowzoo perf $(PERF_ARGS)

report: setup
	$(VENV)/bin/flowzoo report runs/quick --out reports/quick

clean:
	rm -rf $(VENV) runs .pytest_cache
