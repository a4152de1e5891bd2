# The two commands of the README: `make run` (a single-node server, data in ./data)
# and `make test`.  Both set up .venv on first use; nothing else needs installing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 4222
HTTP_PORT ?= 8222
EXTRAS ?= test,bench,chaos

.PHONY: run test install build bench micro profile clean

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q 'Cython>=3.0' 'setuptools>=65' wheel
	$(PY) -m pip install -q --no-build-isolation -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

# Rebuild the Cython modules whenever a .pyx/.pxd changed (cheap when nothing did), and
# compile the Python modules to bytecode ahead of time: where PYTHONDONTWRITEBYTECODE is
# set (it is on the project's machines) every server process would otherwise compile
# them again as it starts, some 0.5 s of each start.
build: install
	$(PY) setup.py -q build_ext --inplace
	$(PY) -m compileall -q natsjs bench

run: build
	mkdir -p data
	$(VENV)/bin/natsjs-server -p $(PORT) -m $(HTTP_PORT) -js -sd data

test: build
	$(PY) -m pytest -q tests

clean:
	rm -rf build natsjs/_core/*.c natsjs/_core/*.so *.egg-info

# ---- benchmarks: bench/README.md ------------------------------------------------------
# natsbench is not a package: NATSBENCH=/path/to/natsbench, or have it on PATH.
NATSBENCH ?=
NATS_SERVER ?=
RESULTS ?= results
BENCH_ARGS ?=
SCENARIO ?= pubsub
PROFILE_BUILD ?= 0
PROFILE_ARGS ?=
SPARK_MASTER ?= local[*]
MICRO_ARGS ?= --benchmark-max-time=0.5
BENCH_TOOLS = $(if $(NATSBENCH),--natsbench $(NATSBENCH))

.PHONY: analyze

# Both servers, same load, alternating; a ratio table on stdout, traces in results/<run>/:
# the natsbench scenarios (bench.run), then the control-plane loads (bench.control).
# PIN=1: every server on core 0, the load generator on core 1 (taskset).
PIN ?= 0
CONTROL_ARGS ?=
BENCH_PIN = $(if $(filter 1,$(PIN)),--pin)
bench: build
	$(PY) -m bench.run $(BENCH_TOOLS) $(if $(NATS_SERVER),--nats-server $(NATS_SERVER)) \
		--results $(RESULTS) $(BENCH_PIN) $(BENCH_ARGS)
	$(PY) -m bench.control $(if $(NATS_SERVER),--nats-server $(NATS_SERVER)) \
		--results $(RESULTS) $(BENCH_PIN) $(CONTROL_ARGS)

# The control-plane loads alone: subscribe rate and RSS per subscription, connection
# set-up, route interest exchange when a server joins (bench/README.md).
.PHONY: bench-control
bench-control: build
	$(PY) -m bench.control $(if $(NATS_SERVER),--nats-server $(NATS_SERVER)) \
		--results $(RESULTS) $(BENCH_PIN) $(CONTROL_ARGS)

# Spark (local mode unless SPARK_MASTER says otherwise) over every run in results/.
analyze: install
	$(PY) -m bench.analyze $(RESULTS) --master '$(SPARK_MASTER)' --out $(RESULTS)/report

# pytest-benchmark of bench/bench_*.py; the JSON becomes a micro run folder in results/.
micro: build
	mkdir -p $(RESULTS)
	$(PY) -m pytest -q bench -o 'python_files=bench_*.py' -p no:cacheprovider \
		--benchmark-json=$(RESULTS)/.micro-latest.json $(MICRO_ARGS)
	$(PY) -m bench.trace micro $(RESULTS)/.micro-latest.json --results $(RESULTS)
	rm -f $(RESULTS)/.micro-latest.json

# py-spy flamegraph of natsjs-server under SCENARIO's load: results/flame-$(SCENARIO).svg.
# PROFILE_BUILD=1 profiles a copy built with NATSJS_PROFILE=1 in build/profile/ (Cython
# profile/linetrace hooks), so the work tree keeps its normal, faster modules.
profile: build
	$(PY) -m bench.profile --scenario $(SCENARIO) --out $(RESULTS)/flame-$(SCENARIO).svg \
		$(if $(filter 1,$(PROFILE_BUILD)),--profile-build) $(BENCH_TOOLS) $(PROFILE_ARGS)

# Route compression, natsjs next to nats-server: per level, wire bytes through a counting
# proxy, compression ratio, throughput, and natsjs's S2 codec speed (bench/README.md).
COMPRESSION_ARGS ?=
.PHONY: bench-compression
bench-compression: build
	$(PY) -m bench.compression $(if $(NATS_SERVER),--nats-server $(NATS_SERVER)) \
		--results $(RESULTS) $(COMPRESSION_ARGS)

# ---- fault injection: natsjs/testing/chaos (README "Faults") ---------------------------
# Every fault class against natsjs and nats-server, one run each; a table on stdout, the
# history and fault timeline as a trace in results/<run>-chaos/.  Power loss needs
# libfuse3 (Debian: libfuse3-3) and /dev/fuse; partitions need nothing.
CHAOS_SERVERS ?= natsjs,nats-server
CHAOS_FAULTS ?= all
CHAOS_ARGS ?=
.PHONY: chaos
chaos: build
	$(PY) -m natsjs.testing.chaos --servers $(CHAOS_SERVERS) --faults $(CHAOS_FAULTS) \
		--results $(RESULTS) $(CHAOS_ARGS)
