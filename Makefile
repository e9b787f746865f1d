# KV Cache by the Numbers: build the course, run its tests.
# `make book` and `make test` each create .venv when it is missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# One pytest worker more than there are cores: many tests wait on kernels, a browser or a
# grading time limit, and the spare worker keeps the cores busy meanwhile.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print((os.cpu_count() or 1) + 1)")

.PHONY: book test lint unit release check lab serve browser book-deps grading-deps system-deps clean

# A fresh install spends most of its time in pip finding and unpacking 200 wheels, on one
# core. constraints.txt pins every package the requirements pull in, so its pins install
# first without resolving (--no-deps), split among INSTALL_JOBS pip processes; xargs fails
# if any of them does. setuptools and wheel, which the venv already has, are left to the
# resolving install after them: upgrading them while another pip scans site-packages
# races. That install finds the pins satisfied, adds anything they miss, and fails on a
# conflict, as it always did.
# pip byte-compiles what it installs on one core (half the install's time, most of it
# torch's); compileall does the same on every core. Compiled here, not on first import:
# the grading sandbox runs kernels on a read-only venv that cannot cache what they compile.
# Packages' own test suites (a ninth of the files) are never imported here: left out.
INSTALL_JOBS := 3
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile
$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	grep -E '^[A-Za-z0-9]' constraints.txt | grep -viE '^(setuptools|wheel)[=<>!~ ]' > $(VENV)/.pins
	xargs -d '\n' -P $(INSTALL_JOBS) -n $$(( ($$(wc -l < $(VENV)/.pins) + $(INSTALL_JOBS) - 1) / $(INSTALL_JOBS) )) \
	  $(PIP_INSTALL) --no-deps --no-warn-conflicts < $(VENV)/.pins
	$(PIP_INSTALL) -r requirements.txt -c constraints.txt
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
	$(PY) -m compileall -q -j 0 -x '/tests/' $(VENV)/lib >/dev/null || true  # a py3.12-only torch file
	touch $@

# The course's own modules, compiled before anything imports them: every page kernel,
# grading kernel and command the build and the tests start imports kvlib and course
# (0.07 CPU s of compiling a page, measured), and an interpreter that may not write
# bytecode (PYTHONDONTWRITEBYTECODE, a sandbox's read-only tree) compiles them in each.
# -q still prints a file that does not compile, and fails.
COMPILE_OWN := $(PY) -m compileall -q kvlib course scripts

## book: build the site into _build/html (warnings are errors); exercises/ is committed and
## left as it is (`make release` regenerates it; a grading test checks it matches solutions/)
book: $(STAMP) book-deps
	$(COMPILE_OWN)
	$(PY) scripts/build_book.py

## test: lint, then type-check beside every test (unit, reference, notebooks, grading, site)
# Test modules go out in collection order, where tests/conftest.py puts the site's last
# and starts the book's build: xdist would otherwise send the largest modules first.
# The duration it prints counts from make's start: installs, lint, types and every test.
MAKE_START := $(shell date +%s)
# mypy (one core, half a minute) checks types beside the tests instead of before them.
test: $(STAMP) system-deps
	@$(COMPILE_OWN)
	@status=0; \
	$(PY) -m ruff check kvlib course tests scripts nbgrader_config.py || exit $$?; \
	$(PY) -m mypy > .mypy.out 2>&1 & types=$$!; \
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope \
	  --no-loadscope-reorder --durations=25 || status=$$?; \
	wait $$types || status=$$?; \
	cat .mypy.out; \
	echo "make test: $$(( $$(date +%s) - $(MAKE_START) )) s in all on $$(nproc) core(s)" \
	  "(set-up, lint, types, tests), exit status $$status"; \
	exit $$status

lint: $(STAMP)
	$(PY) -m ruff check kvlib course tests scripts nbgrader_config.py

unit: $(STAMP) system-deps
	$(PY) -m pytest -m "not reference and not notebooks and not site"

## release: regenerate exercises/ from solutions/ with nbgrader generate_assignment
release: $(STAMP)
	$(PY) scripts/release.py

## grade ASSIGNMENT=NN_slug: autograde submitted/*/NN_slug/ on every core, feedback, grades.csv
## (FORCE=1 regrades submissions already graded; JOBS=n sets the worker processes; WAIT=1
## waits for a make grade already running on the course instead of refusing at once;
## STUDENT=id grades that student only, e.g. with FORCE=1 to regrade one student)
.PHONY: grade
grade: $(STAMP) grading-deps
	@test -n "$(ASSIGNMENT)" || { echo "usage: make grade ASSIGNMENT=01_kv_cache"; exit 2; }
	$(PY) -m course.apps.batch "$(ASSIGNMENT)" $(if $(FORCE),--force) $(if $(JOBS),--jobs $(JOBS)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) $(if $(WAIT),--wait) $(if $(STUDENT),--student $(STUDENT))

## check NB=exercises/NN_slug/name.ipynb: self-grade one notebook
check: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make check NB=exercises/01_kv_cache/<notebook>.ipynb"; exit 2; }
	$(PY) -m course.apps.grade_command "$(NB)"

## lab: JupyterLab on the exercises, offline (no news, update or extension-index requests)
lab: $(STAMP)
	$(VENV)/bin/jupyter lab exercises --LabApp.news_url=None \
	  --LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate \
	  --LabApp.extension_manager=readonly $(if $(filter 0,$(shell id -u)),--allow-root)

## serve: serve the built site on http://127.0.0.1:8000
serve:
	test -f _build/html/index.html || $(MAKE) book
	$(PY) -m http.server --bind 127.0.0.1 --directory _build/html 8000

# Headless Chromium for the site tests (Debian package; never a downloaded browser).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

# npm installs Pyodide (package-lock.json) for the calculator page (Debian package npm).
book-deps:
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null; }

# bubblewrap sandboxes student kernels during grading (Debian package bubblewrap).
grading-deps:
	@command -v bwrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null; }

# Every Debian package the tests start for real: Chromium (site), bubblewrap (grading
# sandbox), Redis (rate limiter) and PostgreSQL (gradebook), and npm (the site's Pyodide).
# Installed once, when missing.
SYSTEM_PACKAGES := chromium:chromium bwrap:bubblewrap redis-server:redis-server \
	/usr/lib/postgresql/*/bin/initdb:postgresql npm:npm
system-deps:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
	  cmd=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$cmd >/dev/null 2>&1 || ls $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $$missing >/dev/null; \
	fi

clean:
	rm -rf _build .pytest_cache .mypy_cache .ruff_cache
