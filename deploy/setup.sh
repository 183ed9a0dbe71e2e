#!/usr/bin/env bash
# Installs every dependency Chorus needs to build, test and run (DESIGN.md §7),
# from Debian bookworm packages only. Idempotent: packages already installed are
# skipped, and apt-get update runs at most once per invocation.
#
# Usage: deploy/setup.sh            (as root, or with sudo available)
set -euo pipefail

readonly PACKAGES=(
  # Build: Bazel 4.2 offline and the rules it needs from Debian.
  bazel-bootstrap bazel-rules-java bazel-platforms
  build-essential pkg-config
  # RPC.
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libssl-dev
  # Status, strings, time, synchronization, flags.
  libabsl-dev
  # LibTorch (CPU) and a fast BLAS for it: without OpenBLAS selected, LibTorch's
  # matrix products run on the reference BLAS, ~17x slower.
  libtorch-dev libopenblas0-openmp
  # CPU collectives.
  libgloo-dev
  # Tests.
  libgtest-dev libgmock-dev
  # Logging, CLI, coordinator state, job specs.
  libgoogle-glog-dev libgflags-dev libcli11-dev libsqlite3-dev libyaml-cpp-dev
  # The coordinator's HTTP port: an HTTP server and the Prometheus client
  # registry and text format.
  libcpp-httplib-dev prometheus-cpp-dev
  # A real data set (IDX files under /usr/share/datasets/fashion-mnist).
  dataset-fashion-mnist
  # PyTorch for TorchScript fixtures and reference runs (/usr/bin/python3).
  python3-torch
  # Fuzzing (fuzz/run_fuzzers.sh): clang with libFuzzer and the sanitizer
  # runtimes.
  clang-14 libfuzzer-14-dev libclang-rt-14-dev
  # Observability tests: a real Prometheus scraping the coordinator, and a
  # headless browser loading its status page.
  prometheus chromium
  # Network namespaces for multi-host tests; a throwaway CA for the TLS tests.
  iproute2
  openssl
)

die() { echo "setup.sh: error: $*" >&2; exit 1; }

SUDO=()
if [[ ${EUID} -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || die "must run as root (or with sudo installed): apt-get needs it"
  SUDO=(sudo)
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("${pkg}")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "setup.sh: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq || die "apt-get update failed; check the Debian mirror configuration"
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || die "apt-get install failed for: ${missing[*]}"
else
  echo "setup.sh: all ${#PACKAGES[@]} packages already installed"
fi

# LibTorch must use OpenBLAS, not the reference BLAS that may be selected by
# default. Select the OpenMP OpenBLAS for both BLAS and LAPACK alternatives.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for alt in "libblas.so.3-${arch}" "liblapack.so.3-${arch}"; do
  lib=${alt%%-${arch}}
  target="/usr/lib/${arch}/openblas-openmp/${lib}"
  if [[ -e "${target}" ]] && update-alternatives --query "${alt}" >/dev/null 2>&1; then
    current=$(update-alternatives --query "${alt}" | awk '/^Value:/ {print $2}')
    if [[ "${current}" != "${target}" ]]; then
      "${SUDO[@]}" update-alternatives --set "${alt}" "${target}" >/dev/null
      echo "setup.sh: selected ${target} for ${alt}"
    fi
  fi
done

[[ -d /usr/share/datasets/fashion-mnist ]] \
  || die "dataset-fashion-mnist installed but /usr/share/datasets/fashion-mnist is missing"
echo "setup.sh: done"
