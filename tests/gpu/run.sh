#!/usr/bin/env bash
# The GPU checks in one command, for a machine with NVIDIA GPUs, CUDA's
# compiler and a CUDA PyTorch (python3), but no Bazel (docs/gpu.md): builds
# the GPU-facing engines and their tests with CMake (tests/gpu/CMakeLists.txt)
# against that PyTorch's LibTorch and NCCL, runs their tests (those tagged cuda
# but //common:device_test, which needs the Bazel build), then
# the GPU benchmark against PyTorch DDP (NCCL) in the same run, whose result
# lines (docs/benchmarks.md) it prints. Prints 'N passed, M failed, K skipped' last (a skipped
# case says why: too few GPUs for it).
#
#   tests/gpu/run.sh [--deps DIR] [--build DIR] [--jobs N] [--no-bench] [--no-tests]
#                    [--bench-args "ARGS"] [--trace DIR]
#
# --bench-args: more arguments for ddp_cuda_bench (e.g. "--model mlp --view 1").
# --trace DIR: the bench also writes profiler traces of both sides to DIR, and
# tests/gpu/trace_summary.py compares them (ddp_cuda_bench's header).
# --deps: a prefix from tests/gpu/collect_deps.sh, for machines without
# Abseil, glog and GoogleTest installed. LIBTORCH_HOME, NCCL_INCLUDE_DIR and
# NCCL_LIBRARY override what is found next to python3's torch;
# CHORUS_TEST_PYTHON names another python3.
set -uo pipefail
cd "$(dirname "$0")/../.."
deps=""
build=build/gpu
jobs=$(nproc)
bench=1
tests=1
bench_args=()
trace=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --deps) deps=$(realpath "$2"); shift 2 ;;
    --build) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --no-tests) tests=0; shift ;;
    --bench-args) read -r -a bench_args <<<"$2"; shift 2 ;;
    --trace) trace=$(realpath -m "$2"); shift 2 ;;
    *) echo "tests/gpu/run.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
export CHORUS_TEST_PYTHON=${CHORUS_TEST_PYTHON:-python3}
py=${CHORUS_TEST_PYTHON}
# cmake and ninja may come with that python's environment.
PATH="${PATH}:$(dirname "$("${py}" -c 'import sys; print(sys.executable)' 2>/dev/null || echo /usr/bin/python3)")"

echo "=== machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader ||
  echo "nvidia-smi failed: no usable NVIDIA driver here"
"${py}" -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda,
  "GPUs", torch.cuda.device_count())' ||
  { echo "${py} has no CUDA PyTorch; set CHORUS_TEST_PYTHON"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
torch_home=${LIBTORCH_HOME:-$("${py}" -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
# Debian's python3-torch keeps its libraries in the system's folders.
[[ -e ${torch_home}/lib/libtorch_cpu.so ]] || torch_home=""
abi=$("${py}" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
# NCCL: PyTorch's own (its nvidia-nccl wheel), else CUDA's; the header from
# --deps when the wheel has none.
site=$(dirname "${torch_home}")
nccl_lib=${NCCL_LIBRARY:-$(find "${site}/nvidia" -name 'libnccl.so*' 2>/dev/null | sort | head -n 1)}
[[ -z ${nccl_lib} ]] && nccl_lib=$(find -L /usr/local/cuda/lib64 /usr/lib -name 'libnccl.so*' 2>/dev/null | sort | head -n 1)
[[ -n ${nccl_lib} ]] || { echo "no libnccl.so found (set NCCL_LIBRARY)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
nccl_inc=${NCCL_INCLUDE_DIR:-}
if [[ -z ${nccl_inc} ]]; then
  for h in "$(dirname "${nccl_lib}")/../include/nccl.h" /usr/local/cuda/include/nccl.h \
    /usr/include/nccl.h "${deps}/nccl/include/nccl.h"; do
    if [[ -f ${h} ]]; then nccl_inc=$(dirname "${h}"); break; fi
  done
fi
echo "LibTorch ${torch_home:-of the system} (C++11 ABI ${abi}); NCCL ${nccl_lib} with ${nccl_inc}/nccl.h"

echo "=== build (CMake, ${jobs} jobs)"
t0=${SECONDS}
mkdir -p "${build}"
# C++17 as in the Bazel build; C++20 once more if a newer LibTorch needs it.
built=0
for standard in 17 20; do
  cmake -S tests/gpu -B "${build}" -G Ninja -DCMAKE_CXX_STANDARD="${standard}" \
    -DLIBTORCH_HOME="${torch_home}" -DTORCH_CXX11_ABI="${abi}" -DNCCL_INCLUDE_DIR="${nccl_inc}" \
    -DNCCL_LIBRARY="${nccl_lib}" ${deps:+-DCHORUS_DEPS_PREFIX="${deps}"} \
    >"${build}/configure.log" 2>&1 ||
    { tail -n 40 "${build}/configure.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  if cmake --build "${build}" -j "${jobs}" -- -k 0 >"${build}/build.log" 2>&1; then
    built=1
    break
  fi
  grep -m 20 -B 2 -A 8 "error" "${build}/build.log" || tail -n 60 "${build}/build.log"
  echo "the build with C++${standard} failed"
done
[[ ${built} -eq 1 ]] || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
[[ -x ${build}/ddp_cuda_test ]] || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
echo "built in $((SECONDS - t0)) s"
[[ -n ${deps} ]] && export LD_LIBRARY_PATH="${deps}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

passed=0
failed=0
skipped=0
export TEST_TMPDIR
TEST_TMPDIR=$(mktemp -d)
trap 'rm -rf "${TEST_TMPDIR}"' EXIT
test_names=(nccl_communicator_test ddp_cuda_test gossip_cuda_test trainer_cuda_test)
[[ ${tests} -eq 1 ]] || test_names=()
for test in "${test_names[@]}"; do
  echo "=== ${test}"
  log="${TEST_TMPDIR}/${test}.log"
  timeout 300 "${build}/${test}" 2>&1 | tee "${log}"
  rc=${PIPESTATUS[0]}
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "${log}" | tail -n 1)
  passed=$((passed + ${p:-0}))
  skipped=$((skipped + ${s:-0}))
  failed=$((failed + ${f:-0}))
  if [[ ${rc} -ne 0 && -z ${f} ]]; then
    echo "${test} exited with ${rc} before its summary"
    failed=$((failed + 1))
  fi
done

if [[ ${bench} -eq 1 ]]; then
  echo "=== ddp_cuda_bench"
  [[ -n ${trace} ]] && mkdir -p "${trace}" && bench_args+=(--trace "${trace}")
  if timeout 400 "${build}/ddp_cuda_bench" "${bench_args[@]}"; then
    passed=$((passed + 1))
  else
    echo "ddp_cuda_bench failed"
    failed=$((failed + 1))
  fi
  if [[ -n ${trace} ]]; then
    for model in mlp cnn; do
      [[ -f ${trace}/chorus_ddp_${model}.json ]] || continue
      echo "=== profiler traces of ${model} (${trace})"
      "${py}" tests/gpu/trace_summary.py "${trace}" "${model}"
    done
  fi
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[[ ${failed} -eq 0 ]]
