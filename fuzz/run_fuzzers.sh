#!/usr/bin/env bash
# Builds the fuzz targets with clang + libFuzzer + ASan/UBSan and runs each
# for a bounded time (docs/fuzzing.md). Prints one line per target, then
# 'N passed, M failed, 0 skipped' (targets) last; exits non-zero if any
# target found a crash (or did not build). A crash's input is kept and the
# line says how to reproduce it and how to make it a regression input.
#
# Usage: fuzz/run_fuzzers.sh [--seconds S] [--seed N] [--jobs J] [--keep DIR] [--build-only] [TARGET...]
#   --seconds S  fuzzing time per target (default 30)
#   --seed N     libFuzzer's random seed (default: a new one each run). CI
#                passes a fixed seed, so a CI run repeats what a longer run
#                with that seed already explored instead of finding new
#                inputs at random; explore with random seeds by hand.
#   --jobs J     targets fuzzed at once (default: the number of CPUs)
#   --keep DIR   where crash inputs and each target's new corpus go
#                (default: a temporary directory, removed unless a target failed)
#   --build-only build the targets and stop (.ci/run builds them ahead so);
#                exits non-zero if the build failed
#   TARGET       labels (default: every target tagged fuzz_target, less those
#                tagged fuzz_manual)
# Environment: CHORUS_FUZZ_OUTPUT_BASE (default
# ~/.cache/chorus/fuzz-output-bases/<hash of the checkout's path>), CC (default clang-14).
#
# The clang build has an output base of its own: Bazel configures its C++
# toolchain from CC, and rebuilding that in the gcc build's output base
# would invalidate every cached gcc action. The disk cache is shared.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=30
seed=0
jobs=$(nproc 2>/dev/null || echo 1)
keep=""
build_only=0
targets=()
while (($# > 0)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done

# One output base per checkout, as Bazel does for the default one.
output_base=${CHORUS_FUZZ_OUTPUT_BASE:-${HOME}/.cache/chorus/fuzz-output-bases/$(pwd -P | md5sum | cut -c1-12)}
export CC=${CC:-clang-14}
if ! command -v "${CC}" >/dev/null 2>&1; then
  echo "run_fuzzers: ${CC} not found (deploy/setup.sh installs clang-14 and libFuzzer)"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
fuzz_bazel() { bazel --output_base="${output_base}" "$@"; }

if ((${#targets[@]} == 0)); then
  # The default output base's server answers: it skips the checkout's
  # bazel-* symlinks, which a second output base would walk into.
  # Targets tagged fuzz_manual are run by name only (docs/fuzzing.md says why).
  mapfile -t targets < <(bazel query 'attr(tags, "fuzz_target", tests(//...))
      except attr(tags, "fuzz_manual", tests(//...))' 2>/dev/null)
fi
if ((${#targets[@]} == 0)); then
  echo "run_fuzzers: no fuzz targets found"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi

# Scratch files of the targets (state databases, checkpoint stores) go to
# memory where possible: the coordinator fsyncs every commit.
scratch_root=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && scratch_root=/dev/shm
work=$(mktemp -d "${scratch_root}/chorus-fuzz-run.XXXXXX")
out=${keep:-${work}/out}
mkdir -p "${out}"

build_start=$(date +%s)
echo "=== building ${#targets[@]} fuzz target(s) with ${CC} (output base ${output_base})"
# No convenience symlinks: bazel-bin in the checkout stays the gcc build's.
if ! fuzz_bazel build --config=fuzz --symlink_prefix=/ "${targets[@]}"; then
  echo "run_fuzzers: the fuzz build failed"
  fuzz_bazel shutdown >/dev/null 2>&1 || true
  rm -rf "${work}"
  echo "0 passed, ${#targets[@]} failed, 0 skipped"
  exit 1
fi
bin_dir=$(fuzz_bazel info --config=fuzz bazel-bin 2>/dev/null)
echo "=== built in $(($(date +%s) - build_start)) s"
if ((build_only)); then
  fuzz_bazel shutdown >/dev/null 2>&1 || true
  rm -rf "${work}"
  exit 0
fi

# Fuzzes one target (a label) for the time given and writes its verdict
# line(s) to ${work}/<name>.result, its first line PASS or FAIL.
fuzz_one() {
  local label=$1 package name binary seeds regressions inputs start rc took runs cov new crash
  package=${label#//}
  package=${package%%:*}
  name=${label##*:}
  binary="${bin_dir}/${package}/${name}"
  seeds="fuzz/corpus/${name}"
  regressions="fuzz/regressions/${name}"
  mkdir -p "${out}/${name}/new_corpus" "${out}/${name}/crashes" "${work}/${name}/tmp"
  inputs=("${out}/${name}/new_corpus" "${seeds}")
  [[ -d ${regressions} ]] && inputs+=("${regressions}")
  start=$(date +%s)
  # The first directory receives new inputs; the committed seeds and
  # regression inputs are only read.
  TMPDIR="${work}/${name}/tmp" ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "${binary}" -max_total_time="${seconds}" -seed="${seed}" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="${out}/${name}/crashes/" "${inputs[@]}" \
    >"${out}/${name}/log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "${out}/${name}/log")
  cov=$(grep -o 'cov: [0-9]*' "${out}/${name}/log" | tail -n 1)
  new=$(find "${out}/${name}/new_corpus" -type f | wc -l)
  crash=$(find "${out}/${name}/crashes" -type f | head -n 1)
  if [[ ${rc} -eq 0 && -z ${crash} ]]; then
    echo "PASS ${label}: ${runs:-?} runs in ${took} s, ${cov:-cov: ?}, ${new} new inputs"
  else
    echo "FAIL ${label}: exit ${rc} after ${took} s; its log ends:"
    tail -n 40 "${out}/${name}/log" | sed 's/^/    /'
    if [[ -n ${crash} ]]; then
      echo "    input: ${crash}"
      echo "    reproduce: CC=${CC} bazel --output_base=${output_base} build --config=fuzz ${label}"
      echo "               ${binary} ${crash}"
      echo "    once fixed, keep it: cp ${crash} ${regressions}/ (bazel test ${label} replays it)"
    fi
  fi
}

# libFuzzer runs one input at a time on one core, and each target fuzzes for
# a fixed time: running --jobs of them at once divides the phase's wall time
# by about that much without shortening any target's search.
fuzz_start=$(date +%s)
running=0
for label in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "${label}" >"${work}/${label##*:}.result" &
  running=$((running + 1))
done
wait
passed=0
failed=0
for label in "${targets[@]}"; do
  cat "${work}/${label##*:}.result"
  if [[ $(head -c 4 "${work}/${label##*:}.result") == PASS ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
echo "=== fuzzed ${#targets[@]} target(s), ${jobs} at a time, in $(($(date +%s) - fuzz_start)) s"

fuzz_bazel shutdown >/dev/null 2>&1 || true
if ((failed == 0)) && [[ -z ${keep} ]]; then
  rm -rf "${work}"
else
  rm -rf "${work:?}"/*/tmp
  echo "crash inputs and logs kept under ${out}"
fi
echo "${passed} passed, ${failed} failed, 0 skipped"
((failed == 0))
