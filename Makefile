# `make test` and `make bench` each set up .venv from nothing (or refresh it) and then run.
# The CPU build of torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup test bench report perf clean help

setup: $(STAMP)  ## create or refresh .venv (CPU torch, the package with its test extra)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

test: setup  ## run the test suite (what .ci/run runs on a clean clone)
	$(PY) -m pytest

bench: setup  ## run the quick CPU suite into runs/quick/ and its report into reports/quick/
	$(VENV)/bin/flowzoo bench quick --runs runs --out reports/quick

# one Flow-GRPO iteration of ours against the released-style loop (ratio, phase split, gradient check); PERF_ARGS
# e.g. "--device cuda --model-path DIR reuse_rollout_graph=true"
perf: setup  ## time one Flow-GRPO iteration against the released-style loop (PERF_ARGS)
	$(VENV)/bin/flowzoo perf $(PERF_ARGS)

report: setup  ## rewrite reports/quick/ from runs/quick/
	$(VENV)/bin/flowzoo report runs/quick --out reports/quick

clean:  ## remove .venv, runs/ and the pytest cache
	rm -rf $(VENV) runs .pytest_cache

help:  ## list these targets
	@sed -n 's/^\([a-z-]*\):.*## \(.*\)/\1\t\2/p' $(firstword $(MAKEFILE_LIST))
