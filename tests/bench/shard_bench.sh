#!/usr/bin/env bash
# Sharded data (data.shards) against its peers: bench/shard_bench.cc
# says what each section measures. Runs every section in its own process
# (the memory section reads the process's peak), RUNS times each, and prints
# their JSON result lines (docs/benchmarks.md); the data is generated once in DIR.
#
# Usage: tests/bench/shard_bench.sh [--runs N] [--dir DIR]
#   (as root: the cold section drops the page cache)
set -euo pipefail
runs=3
dir=/tmp/chorus-shard-bench
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--dir DIR]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
bazel build -c opt //bench:shard_bench >&2
bench=bazel-bin/bench/shard_bench
for section in page_cache page_cache_2k cold compute lm lm_4g lm_in_memory; do
  for ((i = 0; i < runs; ++i)); do
    "${bench}" "${section}" "${dir}" 2> >(grep -v '^[IW][0-9]' >&2)
  done
done
