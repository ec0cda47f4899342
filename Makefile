# Two entry points: `make start` and `make test`. Both create or update .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
CHROMIUM := /usr/bin/chromium

.PHONY: start test venv lint site browser clean

# Reinstall only when the dependency list changes: a no-op run costs a stat.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The site tests drive Debian's chromium through playwright; playwright's own
# browser download cannot work offline, so the system package is installed.
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	  else echo "chromium is missing: run 'sudo apt-get update && sudo apt-get install -y chromium'" >&2; exit 1; fi; \
	fi

lint: $(STAMP)
	$(PY) -m ruff check .

site: $(STAMP)
	$(PY) -m grader.cli build-site

test: $(STAMP) browser lint
	$(PY) -m pytest

start: $(STAMP)
	$(PY) -m grader.cli serve

clean:
	rm -rf build .cache
