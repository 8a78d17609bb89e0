# patchword: two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: venv browser test test-numerics lint format demo compare bench gpu-check clean

venv: $(STAMP)

# torch goes first and pinned: an unpinned torch would pull several GB of CUDA wheels. Which build 2.13.0 is
# comes from pip's index: TORCH_INDEX=https://download.pytorch.org/whl/cpu asks for the CPU build where the
# configured index would give a CUDA one (on Linux, PyPI's torch is the CUDA build).
TORCH_INDEX ?=
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# The browser test (tests/search/test_browser.py) drives Debian's chromium through its chromium-driver; both come
# from apt when /usr/bin/chromedriver is missing (once: the stamp). Without root or apt it only warns and the
# browser test skips (CI runs as root, where it must pass; the test fails instead of skipping when CI is set).
BROWSER_STAMP := $(VENV)/.browser

browser: $(BROWSER_STAMP)

$(BROWSER_STAMP): | $(STAMP)
	@if [ -x /usr/bin/chromedriver ] && [ -x /usr/bin/chromium ]; then \
		touch $@; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
			chromium chromium-driver && touch $@; \
	else \
		echo "warning: /usr/bin/chromedriver is missing and apt-get cannot run here: the browser test will skip" >&2; \
	fi

# The suite in TEST_WORKERS processes (pytest-xdist), each test module whole in one of them (its module
# fixtures built once). Every test runs with one torch thread, so two processes use both cores of the 2-core
# machine: docs/benchmarks.md "Numbers behind code choices". TEST_WORKERS=0 runs it in pytest's own process.
TEST_WORKERS ?= 2
PYTEST_WORKERS = -n $(TEST_WORKERS) --dist loadfile

test: venv browser lint
	$(PY) -m pytest -q $(PYTEST_WORKERS)

# The numerically sensitive tests (pytest marker `numerics`) again with PyTorch's kernels (ATen, MKL, oneDNN)
# restricted to AVX2: a second instruction set's rounding, so a tolerance that holds on one CPU only fails
# here (.ci/run) instead of on the next user's machine.
AVX2_KERNELS := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2

test-numerics: venv
	$(AVX2_KERNELS) $(PY) -m pytest -q $(PYTEST_WORKERS) -m numerics --expect-cpu-capability AVX2

# Fine-tune the paper-variant SEPS on the synthetic scenes (CPU, fixed steps) and print the recall table.
demo: venv
	$(VENV)/bin/patchword demo

# Every matcher fine-tuned from the demo's pretrained encoders for the demo's step count, as a sweep (one run
# per matcher and seed under runs/comparison, resumable) and a report (runs/comparison/report.md / .html):
# docs/benchmarks.md, "Matcher comparison at equal budget". More seeds: make compare SEEDS=0,1,2
SEEDS    ?= 0
ENCODERS := cluttered-64
SELECT   := model.seps.saliency=cls
compare: venv
	$(VENV)/bin/patchword sweep --config demo --seeds $(SEEDS) --name comparison --suite compositional \
		--variant "vse: model.name=vse-tiny model.tiny_pretrained=$(ENCODERS)" \
		--variant "filip: model.name=filip-tiny model.tiny_pretrained=$(ENCODERS)" \
		--variant "laps: model.name=laps-tiny model.tiny_pretrained=$(ENCODERS) $(SELECT)" \
		--variant "seps-code: model.seps.variant=code" \
		--variant "seps-code-leaky: model.seps.variant=code model.seps.dense_pairing=caption" \
		--variant "seps-paper: "
	$(VENV)/bin/patchword report runs/comparison --out runs/comparison/report.md --force

bench: venv
	$(VENV)/bin/patchword bench scoring

# On a lent GPU machine, with the interpreter found there (no venv, nothing installed: it must not depend on
# venv): `PYTHON=python3 make gpu-check`. Within a wall budget (--budget-s, default 450 s) it records the
# device, runs the `cuda` tests, times exhaustive scoring (Flickr30K / COCO-5K shapes), the ViT-B/16 + BERT
# training step and the demo, then profiles scoring; results go to $OUT or gpu_check_out/ (gpu_check.json,
# gpu_check.md) after every step. A CPU smoke run here:
# make gpu-check PYTHON=.venv/bin/python GPU_CHECK_ARGS="--quick --device cpu --out /tmp/gc"
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=src PYTHONUNBUFFERED=1 $(PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# Formatting, lint and the import contracts (pyproject.toml [tool.importlinter]: the layers of
# docs/architecture.md); `make test` runs it first.
lint: venv
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
