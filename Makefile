# Two entry points: `make start` and `make test`. Both create or update .venv themselves.

# The course runs on jax 0.12, which needs Python >= 3.12. PYTHON=/path/to/python overrides the
# search; otherwise the first interpreter below that really runs and is new enough (a pyenv shim
# for a version that is installed but not selected fails, so pyenv's versions are tried too).
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null)
find_python = $(firstword $(foreach p,$(1),$(shell "$(p)" -c 'import sys;   sys.exit(not ((3, $(2)) <= sys.version_info[:2] < (3, 14)))' >/dev/null 2>&1 && command -v "$(p)")))
PYTHON ?= $(call find_python,python3.12 python3.13 python3 \
  $(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3.12 $(PYENV_ROOT)/versions/3.13*/bin/python3.13),12)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# pyproject.toml's extras: all of them in a checkout (a student copy installs `learner` only)
EXTRAS := learner,site,class,dev
CHROMIUM := /usr/bin/chromium

# kernelsim's own suite also runs on the oldest JAX it supports (kernelsim/adapter.py SUPPORTED_JAX),
# in its own venv; `make test-jax JAX=<version>` runs it on any release.
COMPAT_JAX    := 0.10.2
COMPAT_PYTHON ?= $(call find_python,python3.11 python3 $(wildcard $(PYENV_ROOT)/versions/3.11*/bin/python3.11),11)
KERNELSIM_TESTS := tests/kernelsim --ignore=tests/kernelsim/views
# and the learner's side (a student copy installs on Python 3.11 with jax 0.10.2)
COMPAT_TESTS := $(KERNELSIM_TESTS) tests/learner

.PHONY: start start-message test test-main test-jax venv lint site system-packages clean python-check bytecode

python-check:
	@test -n "$(PYTHON)" || { echo "make: no Python 3.12 or 3.13 found (jax 0.12 needs one)." \
	  "Install it (Debian/Ubuntu: apt-get install python3.12-venv; or: pyenv install 3.12)" \
	  "and run again, or name it: make PYTHON=/path/to/python3.12 ..." >&2; exit 1; }

# Reinstall only when the dependency list changes: a no-op run costs a stat. A venv made by an
# older Python (the course used 3.11 before jax 0.12) is replaced.
$(STAMP): pyproject.toml | python-check
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null || rm -rf $(VENV)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@mkdir -p build/logs
	@echo "installing the course's packages into $(VENV): about 1.5 GB, some minutes the first" \
	  "time (log: build/logs/pip-install.log)"
	@: >build/logs/pip-install.log
	@$(PY) -m pip install -q --upgrade pip >>build/logs/pip-install.log 2>&1 || \
	  { tail -20 build/logs/pip-install.log >&2; exit 1; }
	@$(PY) .ci/pip_progress.py build/logs/pip-install.log -- \
	  $(PY) -m pip install --progress-bar off -e '.[$(EXTRAS)]'
	@touch $(STAMP)

venv: $(STAMP)

# System packages: Debian's chromium for the browser tests (playwright's own browser
# download cannot work offline), bubblewrap, the grader's sandbox for submissions, strace (the
# class test records every command line a set-up runs, to find a secret on one), and for a
# class on a hub (deploy/, tests/cluster): PostgreSQL (the gradebook on a server) and Node's npm,
# which installs JupyterHub's proxy, configurable-http-proxy (4.6 runs on Debian 12's node 18).
CHP_VERSION := 4.6.3
system-packages:
	@missing=""; \
	[ -x $(CHROMIUM) ] || missing="$$missing chromium"; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v strace >/dev/null || missing="$$missing strace"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $$missing; \
	  else echo "missing system packages:$$missing; run: sudo apt-get update && sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	fi
	@[ "$$(configurable-http-proxy --version 2>/dev/null)" = $(CHP_VERSION) ] || \
	if [ "$$(id -u)" = 0 ]; then npm install -g -q --no-fund --no-audit configurable-http-proxy@$(CHP_VERSION); \
	else echo "missing configurable-http-proxy $(CHP_VERSION); run: sudo npm install -g configurable-http-proxy@$(CHP_VERSION)" >&2; exit 1; fi

lint: $(STAMP)
	$(PY) -m ruff check .

site: $(STAMP)
	$(PY) -m grader.cli build-site

# The main suite runs as two pytest processes at once, because one alone keeps fewer than one
# of CI's two cores busy on average (services, browsers and jailed runs start and wait): the
# lessons, the site and the class services (which share the lesson cache, the built site and the
# class's accounts) in one, with kernelsim's, the sandbox's and bench's tests, which need no
# course, and two of the workspace's and three of the grader's (modules of their own), which
# balance the two (in a clean clone at 5855c11 on 2 idle cores the other process took 1,053 s
# and this one 1,033 s); every other folder in
# the other. A new test folder joins the second one. Each writes its own junit file for
# bench/ci_time.py; bench/ci_cpu.py says where their CPU goes (both cores are busy throughout,
# so CPU taken out is what saves time).
SIDE_TESTS := tests/lessons tests/site tests/cluster tests/kernelsim tests/sandbox tests/bench \
  tests/workspace/test_workspace.py tests/workspace/test_learner_lab.py \
  tests/grader/tasks/test_flash_attention_backward_task.py \
  tests/grader/tasks/test_adversarial_a05_a07.py \
  tests/grader/jail/test_unsteerable.py
test-main: $(STAMP) bytecode
	@mkdir -p build
	@$(PY) -m pytest --durations=10 --junitxml=build/junit-side.xml $(SIDE_TESTS) \
	  >build/test-side.log 2>&1 & side=$$!; \
	$(PY) -m pytest --durations=20 --junitxml=build/junit.xml $(SIDE_TESTS:%=--ignore=%); main=$$?; \
	wait $$side; side_rc=$$?; \
	echo "--- $(SIDE_TESTS), run beside the above (build/test-side.log) ---"; \
	cat build/test-side.log; \
	exit $$(( main || side_rc ))

# The suite's processes compile the course's modules from source each time where the
# environment says PYTHONDONTWRITEBYTECODE (this CI's does, and the grader's jail always does):
# compiled once here, the jailed runs, notebook kernels and workers read them (0.3 CPU s less
# for each of some 500 processes that import kernelsim and the grader).
BYTECODE_DIRS := grader kernelsim lessons tests bench site
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j0 $(BYTECODE_DIRS)

# kernelsim's suite on the oldest supported JAX runs beside the main suite too, from the start:
# its venv is made while the course's is installed (one core each); its log follows the main
# suite's.
test: system-packages
	@mkdir -p build
	@$(MAKE) --no-print-directory test-jax JAX=$(COMPAT_JAX) PYTHON_FOR_JAX="$(COMPAT_PYTHON)" \
	  JAX_VENV=.venv-compat >build/test-jax.log 2>&1 & compat=$$!; \
	$(MAKE) --no-print-directory lint test-main; main=$$?; \
	wait $$compat; compat_rc=$$?; \
	echo "--- kernelsim's suite on jax $(COMPAT_JAX) (.venv-compat; build/test-jax.log) ---"; \
	cat build/test-jax.log; \
	exit $$(( main || compat_rc ))

# kernelsim's suite on another JAX release, in its own venv (.venv-jax-<version> unless named).
# It installs that jax[cpu] and the `kernelsim-test` extra of pyproject.toml, not the course.
JAX_VENV ?= .venv-jax-$(JAX)
PYTHON_FOR_JAX ?= $(PYTHON)
test-jax:
	@test -n "$(JAX)" || { echo "usage: make test-jax JAX=<jax version, e.g. 0.11.2>" >&2; exit 2; }
	@test -n "$(PYTHON_FOR_JAX)" || { echo "make test-jax: no Python for jax $(JAX) found;" \
	  "name one: PYTHON_FOR_JAX=/path/to/python" >&2; exit 1; }
	$(PYTHON_FOR_JAX) .ci/jax_env.py $(JAX_VENV) $(JAX)
	$(JAX_VENV)/bin/python -m compileall -q -j0 $(BYTECODE_DIRS)
	$(JAX_VENV)/bin/python -m pytest -p no:cacheprovider -q $(COMPAT_TESTS)

# The learner's workspace/ (git-ignored) gets the lessons and the released student notebooks;
# a file the learner edited is never overwritten. No system package is needed to learn. JupyterLab opens there;
# the site is served at once and (re)built behind it when stale.
start: start-message $(STAMP)
	@echo "make start: copying the lessons and exercises into workspace/ (the first time the" \
	  "exercises are released: about 20 s)"
	@$(PY) -m grader.cli workspace
	@$(PY) -m grader.cli serve

# the first thing `make start` prints, before make checks the venv (seconds of silence else)
start-message:
	@echo "make start: checking the course's environment (.venv)"

clean:
	rm -rf build .cache
