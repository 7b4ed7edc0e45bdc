# Two commands do everything on a fresh machine: `make demo` (train the embedded default and record it)
# and `make test`. Both create .venv and install into it. Without a GPU, torch is the CPU build
# (torch==2.13.0, on disk on our dev/CI machines); with a GPU, the torch already installed for your CUDA is reused.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-newest test-oldest lint setup clean runner

setup: $(STAMP)

$(STAMP): pyproject.toml .ci/constraints.txt
	@echo "setting up $(VENV)/ (first time only): torch, transformers, trl, peft, textual and the pinned versions from"
	@echo ".ci/constraints.txt, then sft-tui itself (editable). Measured: 58 s on an idle 2-core machine with the wheels"
	@echo "on local disk; longer where pip downloads them (the CPU torch wheel alone is 183 MB) or the cores are busy"
	@echo "(15 minutes beside 6 other installs)"
	@test -x $(PY) || $(PYTHON) -m venv $(if $(shell command -v nvidia-smi),--system-site-packages,) $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && $(PY) -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then \
		echo "GPU machine: using the installed CUDA torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
		$(PY) -m pip install -q -e ".[dev]"; \
	else \
		$(PY) -m pip install -q torch==2.13.0 && \
		$(PY) -m pip install -q -c .ci/constraints.txt -e ".[dev]"; \
	fi
	@touch $(STAMP)
	@echo "installed: $(VENV)/bin/runner and $(VENV)/bin/sft-tui (put them on PATH with: source $(VENV)/bin/activate)"

# The hint names the run only when one was recorded: quitting the wizard without launching records nothing.
demo: $(STAMP)
	@before=$$(ls records/*.json 2>/dev/null | wc -l); \
	if [ -t 1 ] && [ -z "$$CI" ]; then $(VENV)/bin/sft-tui --recipe tiny-cpu; \
	else $(VENV)/bin/runner run tiny-cpu; fi; code=$$?; \
	if [ "$$(ls records/*.json 2>/dev/null | wc -l)" -gt "$$before" ]; then \
		id=$$(basename "$$(ls -t records/*.json | head -n 1)" .json); \
		echo "next: source $(VENV)/bin/activate, then runner list, runner verify $$id, runner replay $$id"; \
		echo "      (or without activating: make runner ARGS='verify $$id')"; \
	else echo "no run was recorded (nothing was launched)"; fi; exit $$code

# `make runner ARGS="list"`: the runner command from .venv without activating it.
runner: $(STAMP)
	@$(VENV)/bin/runner $(ARGS)

# Two tiers: `make test-fast` runs the tests that start no process (-m "not launches": no torchrun, subprocess, tmux
# or SLURM; tests/conftest.py fails a test that starts one unmarked); `make test` runs every test. The fast tier on
# three pytest-xdist workers that take each other's queued tests when idle (--dist worksteal: its Textual tests leave
# a core idle part of the time, and slow tests dealt last left a worker running alone: the cores were 78% busy with
# the plain deal, 96% with this one, on one 2-core machine); the full suite on two, as many as the cores
# (three were no faster: the launches keep every core busy), tests that share a launch or a cluster in one worker
# (--dist loadgroup). The slowest tests are listed at the end of every run.
# Both let Python write its bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1): without
# it every pytest worker rewrites the tests' asserts again (collecting them took 16.3 CPU-s in one process with no
# cache, 11.3 with one) and every rank, supervisor and CLI process compiles the runner's modules again (up to
# 0.3 s each).
TEST_ENV := PYTHONDONTWRITEBYTECODE=
test: $(STAMP)
	$(TEST_ENV) $(PY) -m pytest -q -n 2 --dist loadgroup --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test-fast: $(STAMP)
	$(TEST_ENV) $(PY) -m pytest -q -n 3 --dist worksteal -m "not launches" --durations=10

# The engine-facing tests (families, packing, both engines, replay) in fresh venvs at the newest releases
# (.venv-newest/, no constraints) and at the lowest supported versions (.venv-oldest/, .ci/oldest.txt); skipped when
# PyPI cannot be reached.
test-newest:
	@PYTHON=$(PYTHON) .ci/newest.sh

test-oldest:
	@PYTHON=$(PYTHON) .ci/oldest.sh

clean:
	rm -rf $(VENV) .venv-newest .venv-oldest runs .pytest_cache
