#!/usr/bin/env bash
# Fills .gpu/ (ignored) with what scripts/gpu_check.sh needs on a GPU machine that has
# PyTorch, transformers and CUDA's compiler but no network and none of modelpool's own
# runtime packages: cp312 manylinux wheels of those (versions from constraints.txt), and
# llama-cpp-python's sdist trimmed of what a CUDA build never reads (llama.cpp's docs, its
# vocab GGUFs, tests, examples, the other GPU backends' sources and a stray .git: 76 MB -> 6 MB), so
# everything travels in the 64 MiB a device call carries. Runs here (needs PyPI), once;
# idempotent. Prints the total size and fails above GPU_CHECK_MAX_MIB (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEST=.gpu
MAX_MIB=${GPU_CHECK_MAX_MIB:-60}
# What the GPU image lacks (its package list: /work/.library/device/KINDS.md), for the
# pool, the llama_cpp and llama_server backends and the GGUF writer. Each with its own
# dependencies the image lacks; nothing the image has is carried (two versions of one
# package stop the install there).
WHEELS=(fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection python-multipart
        jsonschema jsonschema-specifications referencing rpds-py websockets diskcache gguf
        sse-starlette starlette-context pydantic-settings python-dotenv typing-extensions)
LLAMA=llama-cpp-python

pin() {  # the exact version constraints.txt pins, or fail
    local found
    found=$(grep -i -E "^$1==" constraints.txt | head -1 | cut -d= -f3)
    [ -n "$found" ] || { echo "gpu_check_prepare: $1 is not pinned in constraints.txt" >&2; exit 1; }
    echo "$found"
}

mkdir -p "$DEST/wheels" "$DEST/download"
for name in "${WHEELS[@]}"; do
    version=$(pin "$name")
    if ls "$DEST/wheels/" 2>/dev/null | grep -i -q -E "^${name//-/[-_]}-${version}-"; then continue; fi
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$DEST/wheels" "$name==$version"
done

version=$(pin "$LLAMA")
trimmed="$DEST/llama_cpp_python-$version-cuda-src.tar.gz"
if [ ! -f "$trimmed" ]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary=:all: -d "$DEST/download" "$LLAMA==$version"
    work=$(mktemp -d)
    tar -xzf "$DEST/download/llama_cpp_python-$version.tar.gz" -C "$work"
    vendor="$work/llama_cpp_python-$version/vendor/llama.cpp"
    rm -rf "$work/llama_cpp_python-$version"/{.git,.github,examples,docker} \
        "$vendor"/{.git,docs,models,benches,tests,examples,pocs,media,tools/ui,gguf-py/tests}
    for backend in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
        rm -rf "$vendor/ggml/src/ggml-$backend"
    done
    tar -czf "$trimmed" -C "$work" "llama_cpp_python-$version"
    rm -rf "$work" "$DEST/download"
fi

bytes=$(du -cb "$DEST"/wheels/*.whl "$trimmed" | tail -1 | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_check_prepare: $(ls "$DEST"/wheels | wc -l) wheels + $(basename "$trimmed"): ${mib} MiB in $DEST"
if [ "$mib" -gt "$MAX_MIB" ]; then
    echo "gpu_check_prepare: ${mib} MiB is over the ${MAX_MIB} MiB a device call may carry" >&2
    exit 1
fi
