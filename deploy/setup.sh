#!/usr/bin/env bash
# Installs every dependency Chorus needs to build, test and run (docs/building.md),
# from Debian bookworm packages only. Idempotent: packages already installed are
# skipped, and apt-get update runs at most once per invocation.
#
# Usage: deploy/setup.sh            (as root, or with sudo available)
set -euo pipefail

readonly PACKAGES=(
  # Build: Bazel 4.2 offline and the rules it needs from Debian.
  bazel-bootstrap bazel-rules-java bazel-platforms
  build-essential pkg-config
  # The C++ SDK's CMake package (CMakeLists.txt, tests/cmake_package_check.sh).
  cmake
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
  # The Python package (python/): pybind11's headers for its native module,
  # built against python3-torch's LibTorch; pytest for its Python half's
  # tests (python/chorus_test.py).
  pybind11-dev python3-pytest
  # Coordinators sharing one state (--state etcd://...): tests start their own
  # etcd members on loopback ports.
  etcd-server etcd-client
  # Fuzzing (fuzz/run_fuzzers.sh): clang with libFuzzer and the sanitizer
  # runtimes.
  clang-14 libfuzzer-14-dev libclang-rt-14-dev
  # ThreadSanitizer builds compile Abseil's source package (below).
  dpkg-dev
  # Observability tests: a real Prometheus scraping the coordinator, and a
  # headless browser loading its status page.
  prometheus chromium
  # Network namespaces for multi-host tests (veth, tc netem) and packet
  # filters on a test's own veths; a throwaway CA for the TLS tests.
  iproute2 iptables
  openssl
  # Deploy checks: systemd-analyze verifies the units (deploy/systemd), a
  # real Slurm runs deploy/slurm/chorus.sbatch on loopback.
  systemd
  slurm-wlm munge
  # deploy/kubernetes checks: the manifests' YAML (kubectl is below).
  python3-yaml
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

# kubectl renders and decodes the Kubernetes manifests offline (their check
# in tests/): Debian's kubernetes-client, unless a kubectl is installed
# already (another package's /usr/bin/kubectl would conflict with it).
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)

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

# ThreadSanitizer (--config=tsan) sees absl::Mutex only in an Abseil built
# with it (Note [ThreadSanitizer and Abseil], third_party/absl_source.BUILD):
# fetch the source package of the installed libabsl-dev through apt (checked
# against the signed archive like the binaries) into /usr/local/src/chorus.
absl_version=$(dpkg-query -W -f='${source:Version}' libabsl-dev)
absl_upstream=${absl_version%-*}
absl_upstream=${absl_upstream#*:}
absl_dir=/usr/local/src/chorus/abseil-${absl_version}
if [[ ! -d "${absl_dir}/absl" ]]; then
  # Source entries beside the binary ones the machine already uses (deb822
  # .sources files and one-line sources.list entries alike).
  if ! grep -rqs -e '^Types:.*deb-src' -e '^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    entries=""
    for f in /etc/apt/sources.list.d/*.sources; do
      if [[ -e "${f}" ]] && grep -q 'debian' "${f}"; then
        entries+="$(sed 's/^Types: deb$/Types: deb-src/' "${f}")"$'\n\n'
      fi
    done
    [[ -n "${entries}" ]] \
      && printf '%s' "${entries}" | "${SUDO[@]}" tee /etc/apt/sources.list.d/chorus-deb-src.sources >/dev/null
    lines=$(sed -n 's/^deb \(.*debian.*\)$/deb-src \1/p' /etc/apt/sources.list 2>/dev/null || true)
    [[ -n "${lines}" ]] \
      && printf '%s\n' "${lines}" | "${SUDO[@]}" tee /etc/apt/sources.list.d/chorus-deb-src.list >/dev/null
  fi
  "${SUDO[@]}" apt-get update -qq || die "apt-get update failed (with Debian source entries added)"
  fetch=$(mktemp -d)
  (cd "${fetch}" && apt-get source -qq "abseil=${absl_version}") \
    || die "cannot fetch Abseil's source package abseil=${absl_version} (needed by --config=tsan)"
  "${SUDO[@]}" mkdir -p /usr/local/src/chorus
  "${SUDO[@]}" rm -rf "${absl_dir}"
  "${SUDO[@]}" mv "${fetch}/abseil-${absl_upstream}" "${absl_dir}"
  rm -rf "${fetch}"
  echo "setup.sh: Abseil ${absl_version} source in ${absl_dir}"
fi
"${SUDO[@]}" ln -sfn "${absl_dir}" /usr/local/src/chorus/abseil

[[ -d /usr/share/datasets/fashion-mnist ]] \
  || die "dataset-fashion-mnist installed but /usr/share/datasets/fashion-mnist is missing"
echo "setup.sh: done"
