# The two commands a newcomer runs: `make demo` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base

.PHONY: demo test test-lowest test-compat test-qemu lint typecheck unit bench soak clean browser pgbouncer vm-guest

# `make demo` installs PAL alone; `make test` adds the dev tools (pytest, ruff, mypy, playwright, ...);
# both at the exact versions of constraints.txt, inside pyproject.toml's ranges.
$(BASE_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,all]'
	touch $(STAMP)

# PAL alone, without its optional parts (pyproject.toml's extras): tests/e2e/test_optional_parts.py
# runs the demo there and checks that what needs a missing part says which extra to install.
CORE := .venv-core
$(CORE)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(CORE)
	$(CORE)/bin/pip install --quiet --upgrade pip
	$(CORE)/bin/pip install --quiet -c constraints.txt -e .
	touch $@

demo: $(BASE_STAMP)
	env -u PAL_DATABASE_URL -u PAL_BROKER_URL $(BIN)/pal demo

# The whole suite in three lanes at once, then the tests that restart Postgres alone (tests/run_suite.py);
# with PYTEST_ARGS, one plain pytest run of what they select.
test: $(STAMP) $(CORE)/.installed lint typecheck browser pgbouncer vm-guest
	$(if $(PYTEST_ARGS),$(BIN)/pytest $(PYTEST_ARGS),$(BIN)/python -m tests.run_suite)

# The core and end-to-end lanes again on the lowest supported stack (constraints-lowest.txt:
# Celery 5.5, kombu 5.5, redis-py 5, SQLAlchemy 2.0, FastAPI 0.115, OpenAI 1.x) in .venv-lowest;
# CI runs it after `make test`. `make test-compat` runs both.
LOWEST := .venv-lowest
$(LOWEST)/.installed: pyproject.toml constraints-lowest.txt
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install --quiet --upgrade pip
	$(LOWEST)/bin/pip install --quiet -c constraints-lowest.txt -e '.[dev,all]'
	touch $@

test-lowest: $(LOWEST)/.installed $(CORE)/.installed browser pgbouncer
	$(LOWEST)/bin/python -m tests.run_suite --lowest $(PYTEST_ARGS)

test-compat: test test-lowest

# Only the qemu-microvm crash-resume test (make test runs it too).
test-qemu: $(STAMP) vm-guest
	$(BIN)/pytest -m qemu tests/e2e/test_isolated_tier.py

# The dashboard test drives Debian's Chromium through Playwright (never a downloaded browser).
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# Debian's PgBouncer, which tests/e2e/test_pgbouncer.py starts in front of the suite's Postgres.
pgbouncer:
	@command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pgbouncer; }

# The qemu-microvm driver's host tools and guest (docs/isolated-tier.md): Debian's qemu, and a
# kernel and initrd built from Debian packages by pal.vms.guest_image, under .venv/vm-guest.
VM_GUEST := $(VENV)/vm-guest
vm-guest: $(VM_GUEST)/initrd.img

$(VM_GUEST)/initrd.img: $(STAMP) src/pal/vms/guest_image.py
	@command -v qemu-system-x86_64 >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-system-x86; }
	$(BIN)/python -m pal.vms.guest_image $(VM_GUEST)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench beat_schedule.py

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

# The soak alone, for longer: make soak DURATION=10m [SEED=123] (make test runs it for 30 s).
DURATION ?= 45s
soak: $(STAMP)
	PAL_SOAK_DURATION=$(DURATION) PAL_SOAK_SEED=$(SEED) $(BIN)/pytest -s tests/soak

# Every benchmark and its peers (DBOS included) in one run; rewrites the results block of
# docs/benchmarks.md. Not part of `make test`. REPS=5 for more repetitions, QUICK=1 for a smoke run.
REPS ?= 3
bench: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,all,bench]'
	$(BIN)/python bench/all.py --reps $(REPS) $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) $(LOWEST) $(CORE) .pal .mypy_cache .ruff_cache
