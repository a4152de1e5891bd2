# The two commands of the README: `make run` (a single-node server, data in ./data)
# and `make test`.  Both set up .venv on first use; nothing else needs installing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 4222
HTTP_PORT ?= 8222
EXTRAS ?= test,bench

.PHONY: run test install build bench micro profile clean

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q 'Cython>=3.0' 'setuptools>=65' wheel
	$(PY) -m pip install -q --no-build-isolation -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

# Rebuild the Cython modules whenever a .pyx/.pxd changed (cheap when nothing did).
build: install
	$(PY) setup.py -q build_ext --inplace

run: build
	mkdir -p data
	$(VENV)/bin/natsjs-server -p $(PORT) -m $(HTTP_PORT)

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

# Both servers, same load, alternating; a ratio table on stdout, traces in results/<run>/.
bench: build
	$(PY) -m bench.run $(BENCH_TOOLS) $(if $(NATS_SERVER),--nats-server $(NATS_SERVER)) \
		--results $(RESULTS) $(BENCH_ARGS)

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
# PROFILE_BUILD=1 rebuilds the Cython modules with NATSJS_PROFILE=1 first, and rebuilds
# them normally afterwards so the tree is not left with the slower instrumented build.
profile: build
ifeq ($(PROFILE_BUILD),1)
	NATSJS_PROFILE=1 $(PY) setup.py -q build_ext --inplace --force
	$(PY) -m bench.profile --scenario $(SCENARIO) --out $(RESULTS)/flame-$(SCENARIO).svg \
		$(BENCH_TOOLS) $(PROFILE_ARGS); \
		status=$$?; $(PY) setup.py -q build_ext --inplace --force; exit $$status
else
	$(PY) -m bench.profile --scenario $(SCENARIO) --out $(RESULTS)/flame-$(SCENARIO).svg \
		$(BENCH_TOOLS) $(PROFILE_ARGS)
endif

# ---- single-file binary: packaging/README.md -----------------------------------------
# dist/natsjs-server: the server, its Cython modules and a Python runtime in one
# executable (PyInstaller --onefile, packaging/natsjs-server.spec) that runs where no
# Python is set up.  PYINSTALLER is the `binary` extra's requirement in pyproject.toml.
PYINSTALLER ?= pyinstaller>=6.10,<7
BINARY_DIST ?= dist
BINARY_WORK ?= build/pyinstaller

.PHONY: binary
binary: build
	$(PY) -c 'import PyInstaller' 2>/dev/null || $(PY) -m pip install -q '$(PYINSTALLER)'
	PYINSTALLER_CONFIG_DIR='$(abspath $(BINARY_WORK))/cache' $(PY) -m PyInstaller \
		--noconfirm --clean --log-level WARN \
		--distpath '$(BINARY_DIST)' --workpath '$(BINARY_WORK)' packaging/natsjs-server.spec
	@ls -l '$(BINARY_DIST)/natsjs-server'
