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
# pytest workers (xdist); CI's second pass uses one worker with two torch threads.
TEST_WORKERS ?= 2

.PHONY: demo test bench families clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[all,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/diagnose demo --out demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The families table of the README: tiny random Hugging Face models, nothing downloaded (a few minutes).
families: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python bench/families.py

clean:
	rm -rf $(VENV) demo-out
