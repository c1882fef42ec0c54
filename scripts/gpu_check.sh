#!/usr/bin/env bash
# modelpool's GPU check (issue 32), for a machine with an NVIDIA GPU, CUDA's compiler,
# PyTorch and transformers but no network. First, where there is a network:
#     scripts/gpu_check_prepare.sh          # fills .gpu/ (~10 MiB): wheels + llama.cpp sources
# then on the GPU machine, from the repository root (.gpu/ copied along):
#     scripts/gpu_check.sh                  # report in $OUT (default .gpu/out)
#     scripts/gpu_check.sh --dry-run        # no install, no build: every check "skipped"
# It installs the wheels into a private target dir, builds llama-cpp-python with CUDA
# (sm_${CUDA_ARCH:-90}; all cores), then runs scripts/gpu_check.py: one check per function,
# each in its own process. Budget: the whole run under 10 minutes on 16 cores. Exit status
# 1 when a check failed (or the build did: the llama.cpp checks then fail saying so).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.gpu/out}
PYTHON=${PYTHON:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
began=$(date +%s)

if [ "${1:-}" = "--dry-run" ]; then
    exec "$PYTHON" scripts/gpu_check.py --dry-run --out "$OUT"
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then  # nothing to build for: each check says why it skips
    exec "$PYTHON" scripts/gpu_check.py --out "$OUT"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu_check: GPU /'
shopt -s nullglob
wheels=(.gpu/wheels/*.whl)
sources=(.gpu/llama_cpp_python-*-cuda-src.tar.gz)
if [ ${#wheels[@]} -eq 0 ] || [ ${#sources[@]} -eq 0 ]; then
    echo "gpu_check: .gpu/ is empty: run scripts/gpu_check_prepare.sh where there is a network, and carry .gpu" >&2
    exit 2
fi
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
    || { echo "gpu_check: installing the wheels failed" >&2; exit 2; }

# llama-cpp-python for CUDA: its build backend (scikit-build-core), CMake and ninja come
# with the image, hence --no-build-isolation. One GPU architecture keeps nvcc's share short.
build_start=$(date +%s)
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_NATIVE=ON" \
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
    --target "$SITE" "${sources[0]}" >"$OUT/llama_build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - build_start ))
printf '{"llama_cpp_python": "%s", "cuda_arch": "%s", "rc": %d, "seconds": %d, "cores": %d}\n' \
    "$(basename "${sources[0]}")" "${CUDA_ARCH:-90}" "$build_rc" "$build_s" "$(nproc)" >"$OUT/build.json"
echo "gpu_check: llama-cpp-python CUDA build exit $build_rc in ${build_s} s (log: llama_build.log)"
[ "$build_rc" -eq 0 ] || tail -20 "$OUT/llama_build.log" >&2

# What is left of the 10 minutes (less 30 s for the start and the report) goes to the checks.
"$PYTHON" scripts/gpu_check.py --out "$OUT" --build-json "$OUT/build.json" \
    --deadline-s $(( ${GPU_CHECK_BUDGET_S:-570} - ($(date +%s) - began) ))
status=$?
echo "gpu_check: done in $(( $(date +%s) - began )) s, exit $status; report: $OUT/gpu_check.md"
exit $status
