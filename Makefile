# minigpt course: every task in one place. The two commands a new machine needs:
#   make course   build the website, every chapter executed, into _build/html
#   make test     run the whole test suite
# Both create the Python environment (.venv) from scratch when it is missing or out of date.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Offline by default: tiktoken reads the course's copy of GPT-2's files; Hugging Face never downloads.
export TIKTOKEN_CACHE_DIR := $(CURDIR)/src/coursekit/data/tiktoken
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# A MPLBACKEND inherited from the shell would replace the notebooks' inline backend: no plots in the book.
unexport MPLBACKEND

.PHONY: course test lab test-fast env notebooks bench bench-grading model recorded clean system-packages student-release hub-tools

# A failed build ends with each failing page, its cell's line and the error (tools/build_failures.py).
course: $(STAMP)
	@start=$$(date +%s); $(BIN)/jupyter-book build --all -W --keep-going . \
	  || { $(BIN)/python tools/build_failures.py --since $$start; exit 1; }
	@echo "The course website is in _build/html: open $(CURDIR)/_build/html/index.html in a browser."

# The whole suite on two workers, one test file each at a time, the longest files first (tests/conftest.py:
# LONGEST_FIRST); it prints its 15 slowest tests, and fails past its time budget (tests/conftest.py: 40 minutes for now)
# naming its 10 slowest.
test: $(STAMP) system-packages hub-tools
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15

# JupyterLab on the learner notebooks. Jupyter refuses to run as root unless told to: as root (a container), it is.
lab: $(STAMP)
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

# The quick loop: everything but the tests marked slow (the chapters' mutants and variants, real grading runs, the
# book build, the browser, the hub). A chapter's own mutants: .venv/bin/python -m pytest tests/test_chapterNN_grading.py
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

env: $(STAMP)

# Rebuilt when the project's requirements change. constraints.txt pins every package to the versions
# the course was tested with. torch comes first, alone, from PyTorch's CPU index: constraints.txt asks for its
# CPU build (2.13.0+cpu, about 190 MB with its dependencies) on Linux x86-64, where PyPI's torch is a CUDA build
# of several GB. Where that index cannot be reached pip retries for about 8 s and takes a copy it has locally, or
# stops with an error: it never falls back to the CUDA build. Only torch asks that index, without its
# dependencies (pip would retry the index for every package). The second step installs them from PyPI with uv
# (pinned in constraints.txt too), which fetches and unpacks the ~140 packages in parallel: 11 s where pip takes
# 76 s on a 2-core machine, the same versions (tests/test_environment.py). --compile-bytecode, as pip does: uv leaves
# it out by default, and a sandboxed kernel, whose environment is read-only, would compile every module it imports
# again at each start (the grading tests ran 30-50% slower). uv has no fallback for an index it cannot reach, so
# torch's step stays pip's.
# Python 3.11.5 to 3.14: tools/check_python.py makes .venv with $(PYTHON) where it is one of those, else with a CPython
# 3.11 that uv downloads (it says so). `make env TORCH_INDEX=` (empty) takes PyPI's torch 2.13.0 instead, where
# PyTorch's index has no CPU build for this Python or cannot be reached: on Linux x86-64 the CUDA build and its CUDA
# packages (several GB, unpinned), installed under a copy of constraints.txt without the CPU build's label. Only
# when asked: a failed CPU step never falls back to it.
TORCH_INDEX := https://download.pytorch.org/whl/cpu
CONSTRAINTS = $(if $(TORCH_INDEX),constraints.txt,$(VENV)/constraints.txt)
NO_CPU_TORCH := pip found no torch CPU build for this Python: make env TORCH_INDEX= takes PyPI's torch instead (on Linux x86-64 the CUDA build, several GB)
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) tools/check_python.py $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),,sed "s/^torch==\([^+]*\)+cpu /torch==\1 /" constraints.txt > $(CONSTRAINTS))
	$(BIN)/python -m pip install --quiet --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) )-c $(CONSTRAINTS) torch \
	  || { $(if $(TORCH_INDEX),echo "$(NO_CPU_TORCH)";) exit 1; }
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -c $(CONSTRAINTS) -e ".[dev]"
	$(BIN)/python -m pip check
	$(BIN)/python tools/lab_settings.py
	touch $(STAMP)

# Binder's environment: every pin of constraints.txt, for pip (tests/test_environment.py resolves it).
environment.yml: constraints.txt tools/binder_environment.py | $(STAMP)
	$(BIN)/python tools/binder_environment.py

# Debian packages the tests need: Chromium (the browser tests drive it headless; Selenium drives it through Debian's
# chromedriver in the hub test) and bubblewrap (minigpt-grade's sandbox). Installed with apt-get when this runs as
# root; otherwise the command to run is printed.
SYSTEM_PACKAGES := chromium:chromium chromedriver:chromium-driver bwrap:bubblewrap
system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do command -v $${p%%:*} >/dev/null || missing="$$missing $${p##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	  else echo "The tests need:$$missing (sudo apt-get install$$missing)"; exit 1; fi; fi

# JupyterHub's proxy for the hub test (tests/test_hub.py): configurable-http-proxy from npm, at the versions
# tools/hub/package-lock.json pins (Node.js and npm needed).
HUB_PROXY := tools/hub/node_modules/.bin/configurable-http-proxy
hub-tools: $(HUB_PROXY)
$(HUB_PROXY): tools/hub/package.json tools/hub/package-lock.json
	cd tools/hub && npm ci --no-audit --no-fund
	touch $@

# After editing a notebook in solutions/: regenerate the reference package and the learner notebooks.
notebooks: $(STAMP)
	$(BIN)/minigpt-export solutions src/minigpt
	$(BIN)/python -m autograder.publish.release

# What learners get, without solutions, hidden tests or the reference, for a repository of its own:
#   make student-release RELEASE_URL=https://github.com/ORG/REPO [RELEASE_BRANCH=main] [RELEASE_OUT=dir]
# RELEASE_URL is where RELEASE_OUT will be pushed: the website's Binder buttons open it.
RELEASE_OUT ?= _build/student-release
RELEASE_BRANCH ?= main
student-release: $(STAMP)
	$(BIN)/python -m autograder.publish.student_release $(RELEASE_OUT) --branch $(RELEASE_BRANCH) \
	  $(if $(RELEASE_URL),--repository-url $(RELEASE_URL))

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# A 50-submission class of chapter 1 (right, wrong and hostile notebooks) through minigpt-grade: notebooks per minute;
# then one learner's whole course (every graded chapter): each notebook's time and the batch's;
# then a class of 24 graded here and on Dask clusters of 1 and 2 workers: notebooks per minute each way.
bench-grading: $(STAMP)
	$(BIN)/python benchmarks/grade_class.py
	$(BIN)/python benchmarks/grade_class.py --course
	$(BIN)/python benchmarks/grade_class.py --count 24 --workers 1,2

# Retrain the small model the course ships with chapter 8's code (about 1.5 hours of 2 CPU cores; after a stop,
# .venv/bin/python training/train_shipped_model.py --resume goes on): see training/README.md.
model: $(STAMP)
	$(BIN)/python training/train_shipped_model.py

# Hugging Face's answers to the learners' own tests, computed again (src/coursekit/data/recorded/README.md)
recorded: $(STAMP)
	$(BIN)/python -m coursekit.recorded

clean:
	rm -rf _build .grading submitted autograded feedback gradebook.db
