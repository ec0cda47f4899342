# Two entry points: `make start` and `make test`. Both create or update .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
CHROMIUM := /usr/bin/chromium

.PHONY: start test venv lint site system-packages clean

# Reinstall only when the dependency list changes: a no-op run costs a stat.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# System packages: Debian's chromium for the browser tests (playwright's own browser
# download cannot work offline) and bubblewrap, the grader's sandbox for submissions.
system-packages:
	@missing=""; \
	[ -x $(CHROMIUM) ] || missing="$$missing chromium"; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $$missing; \
	  else echo "missing system packages:$$missing; run: sudo apt-get update && sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	fi

lint: $(STAMP)
	$(PY) -m ruff check .

site: $(STAMP)
	$(PY) -m grader.cli build-site

test: $(STAMP) system-packages lint
	$(PY) -m pytest

# The student notebooks are generated (git-ignored): release them so the site links them
# and JupyterLab opens them.
start: $(STAMP) system-packages
	$(PY) -m grader.cli release
	$(PY) -m grader.cli serve

clean:
	rm -rf build .cache
