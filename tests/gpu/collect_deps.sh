#!/usr/bin/env bash
# Copies the libraries tests/gpu needs besides LibTorch, CUDA and NCCL
# (Abseil, glog, gflags, libunwind, GoogleTest; headers and libraries, as
# deploy/setup.sh installed them here) and NCCL's header into one prefix, for
# a GPU machine that has none of them installed:
#
#   tests/gpu/collect_deps.sh DIR      # here
#   tests/gpu/run.sh --deps DIR        # there, with DIR copied along
#
# The libraries are Debian 12's (glibc 2.36, the C++11 ABI): they load on any
# newer x86-64 glibc system.
set -euo pipefail
dir=${1:?usage: tests/gpu/collect_deps.sh DIR}
arch_lib=/usr/lib/$(gcc -print-multiarch)
mkdir -p "${dir}/include" "${dir}/lib" "${dir}/nccl/include"
for h in absl glog gflags gtest gmock; do
  [[ -d /usr/include/${h} ]] || { echo "missing /usr/include/${h}: run deploy/setup.sh" >&2; exit 1; }
  cp -a "/usr/include/${h}" "${dir}/include/"
done
cp -a "${arch_lib}"/libabsl_*.so* "${arch_lib}"/libglog.so* "${arch_lib}"/libgflags.so* \
  "${arch_lib}"/libunwind.so.8* "${arch_lib}"/libgtest*.a "${arch_lib}"/libgmock*.a "${dir}/lib/"
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ -f ${cuda_home}/include/nccl.h ]]; then
  cp "${cuda_home}/include/nccl.h" "${dir}/nccl/include/"
fi
du -sh "${dir}"
