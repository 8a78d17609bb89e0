# patchword: two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: venv test lint format demo bench clean

venv: $(STAMP)

# torch goes first and pinned: an unpinned torch would pull several GB of CUDA wheels.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q

# Train the paper-variant SEPS on the synthetic scenes (CPU, ~10 min) and print the recall table.
demo: venv
	$(VENV)/bin/patchword demo

bench: venv
	$(VENV)/bin/patchword bench scoring

lint: venv
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks

format: venv
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
