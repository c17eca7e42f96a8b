# `make test` and `make bench` each set up .venv from nothing (or refresh it) and then run.
# The CPU build of torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup test bench report report-check perf gpu-check gpu-check-offline gpu-check-plan sharded-gpu-check scale-check clean help

setup: $(STAMP)  ## create or refresh .venv (CPU torch, the package with its test extra)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# the suite in TEST_WORKERS pytest-xdist processes; --dist loadfile keeps each file's tests in one process, in order
# (tests/test_device_placement.py's contract check reads what the float64 tests of its file saw). TEST_WORKERS=0: one process
TEST_WORKERS ?= 2

test: setup  ## run the test suite (what .ci/run runs on a clean clone), in TEST_WORKERS processes (default 2)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

bench: setup  ## run the quick CPU suite into runs/quick/ and its report into reports/quick/
	$(VENV)/bin/flowzoo bench quick --runs runs --out reports/quick

# one Flow-GRPO iteration of ours against the released-style loop (ratio, phase split, gradient check); PERF_ARGS
# e.g. "--device cuda --model-path DIR reuse_rollout_graph=false"; then the interleaved pytest-benchmark pairs, whose
# ours/reference ratios fail the target when more than 15% above the committed baseline (docs/perf.md)
PERF_JSON ?= /tmp/flowzoo-perf.json
perf: setup  ## time one Flow-GRPO iteration against the released-style loop; fail on a >15% ratio regression
	$(VENV)/bin/flowzoo perf $(PERF_ARGS)
	$(PY) -m pytest tests/test_bench_perf.py -o addopts="" -q --benchmark-only --benchmark-json=$(PERF_JSON)
	$(VENV)/bin/flowzoo perf-compare benchmark/perf/baseline.json $(PERF_JSON)

# with 2 or more GPUs visible, then one sharded (FSDP2, NCCL) OP-GRPO run of 2 steps with buffer replay on 2 of them,
# the lockstep check on (the tiny tier, full fine-tuning; docs/models.md "Scale rehearsal")
SHARDED_DEVICE ?= cuda
SHARDED_ARGS = model.args.finetune=full model.args.fsdp=true model.args.device=$(SHARDED_DEVICE) \
	algorithm.name=op_grpo algorithm.off_policy_groups=0.5 algorithm.replay_prompts=buffer algorithm.replay_k=1 \
	algorithm.t_off=1 train.prompt_sampler=replay_buffer train.steps=2 train.prompts_per_step=2 train.eval_prompts=2 \
	train.checkpoint_every=0 run_dir=$(SHARDED_RUN)
SHARDED_RUN ?= /tmp/flowzoo-gpu-check-sharded
gpu-check: setup  ## SD3.5-Medium, FLUX.1-dev and Qwen-Image sized random models on one GPU against the released step structures (one H100 80 GB, 8 minutes); with 2+ GPUs a sharded OP-GRPO run with replay (docs/perf.md)
	$(VENV)/bin/flowzoo perf --gpu-check --device cuda $(PERF_ARGS)
	$(MAKE) --no-print-directory sharded-gpu-check

# the same check on a GPU machine with torch, transformers and peft but no package registry: no setup, no install of
# FlowZoo; the wheels in GPU_WHEELS (diffusers-0.42.1-py3-none-any.whl) are installed offline into a temporary folder
GPU_WHEELS ?= wheels
gpu-check-offline:  ## the GPU check with the machine's own python and the carried wheels in GPU_WHEELS (no registry, no setup; README "GPUs")
	PYTHONUNBUFFERED=1 $(PYTHON) -m flowzoo perf --gpu-check --device cuda --wheels $(GPU_WHEELS) $(PERF_ARGS)

gpu-check-plan:  ## list the GPU check's variants, expected memory and H100 seconds and its time budget (runs on the CPU)
	$(PYTHON) -m flowzoo perf --gpu-check --plan

sharded-gpu-check: setup  ## with 2+ GPUs: one sharded OP-GRPO run with buffer replay on 2 of them (skipped, and says so, with fewer)
	@gpus=$$($(PY) -c "import torch; print(torch.cuda.device_count() if '$(SHARDED_DEVICE)' == 'cuda' else 2)"); \
	if [ "$$gpus" -lt 2 ]; then echo "sharded-gpu-check: $$gpus GPU(s) visible; the sharded OP-GRPO run needs 2 (skipped)"; \
	else rm -rf $(SHARDED_RUN) && FLOWZOO_CHECK_LOCKSTEP=1 OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node 2 \
		-m flowzoo train benchmark/configs/tiny_flow_grpo.yaml $(SHARDED_ARGS) --quiet && \
		$(PY) -c "import pandas as p; m = p.read_csv('$(SHARDED_RUN)/metrics.csv'); print(m[['step', 'reward_mean', 'grad_norm', 'off_policy_frac', 'fsdp_padding_calls', 't_sampling', 't_training']].to_string(index=False)); assert m['off_policy_frac'].max() > 0, 'no sample was replayed'"; fi

# the scale rehearsal (docs/models.md): every algorithm x prompt sampler x LoRA/full x replicated/FSDP2 on 2 CPU
# processes against 1 (tests/test_scale_matrix.py), then every paper suite's algorithms on tiny pipelines of their
# models, sharded and replicated, killed and resumed on 1 process, evaluated and exported (tests/test_scale_rehearsal.py);
# then the GPU check's sharded OP-GRPO run on 2 CPU processes
scale-check: setup  ## the whole scale rehearsal on 2 CPU processes (make test runs a subset), then sharded-gpu-check's CPU dry run
	FLOWZOO_SCALE_MATRIX=full $(PY) -m pytest tests/test_scale_matrix.py tests/test_scale_rehearsal.py -p no:cacheprovider -rf
	FLOWZOO_SCALE_MATRIX=full $(PY) -m pytest tests/test_models_wan22.py tests/test_models_flux_kontext.py tests/test_models_qwen_image_edit.py -k sharded_two_process_rehearsal -p no:cacheprovider -rf
	$(MAKE) --no-print-directory sharded-gpu-check SHARDED_DEVICE=cpu

report: setup  ## rewrite reports/quick/ from runs/quick/
	$(VENV)/bin/flowzoo report runs/quick --out reports/quick

# the committed example reports in headless Chromium (the OS package, installed when missing and possible): fails
# on a missing image, a broken link, or a first screen without a figure; writes docs/report-<name>-first-screen.png.
# Then reruns the first 3 steps of every cell of reports/example-quick (fingerprint.json): fails when today's code
# or recipe gives other numbers, i.e. when the example is stale (45 cells: ~2 CPU-minutes, the edit ones the dearest).
# Without a browser only the static checks run, and the output says that the browser part was skipped and why.
REPORT_CHECK ?= reports/example-quick reports/example-op-grpo-study reports/example-tiny-counting-study reports/example-tiny-rare-counting-study
REPORT_CHECK_TABLES ?=
report-check: setup  ## check the example reports in headless Chromium (images, links, a figure on the first screen)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ; } || \
		echo "report-check: could not install chromium from the OS packages (needs root and apt-get)"
	$(VENV)/bin/flowzoo check-report $(REPORT_CHECK) $(foreach d,$(REPORT_CHECK_TABLES),--no-figure $(d)) --screenshots docs
	$(VENV)/bin/flowzoo freshness reports/example-quick --suite quick

clean:  ## remove .venv, runs/ and the pytest cache
	rm -rf $(VENV) runs .pytest_cache

help:  ## list these targets
	@sed -n 's/^\([a-z-]*\):.*## \(.*\)/\1\t\2/p' $(firstword $(MAKEFILE_LIST))
