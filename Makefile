# Two commands for a new user: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch must be installed before anything that depends on torch;
# a bare `torch` requirement can pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.diagnose-installed

.PHONY: demo test bench families clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[all,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/diagnose demo --out demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The families table of the README: tiny random Hugging Face models, nothing downloaded (a few minutes).
families: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python bench/families.py

clean:
	rm -rf $(VENV) demo-out
