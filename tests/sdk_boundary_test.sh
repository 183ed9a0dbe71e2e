#!/usr/bin/env bash
# The SDK's boundary: nothing in sdk/ or worker/runtime/ builds on the
# built-in trainer (worker/train/). A program of one's own links the SDK and
# the rank runtime, never the trainer; what both need (TrainingProgress,
# the checkpoint file format) lives below the trainer
# (worker/runtime/training_progress.h, worker/tensor_file/). Checked: no
# source includes "worker/train/..." and no BUILD file depends on
# //worker/train.
#
# Usage: sdk_boundary_test.sh FILE...   (Bazel passes every source and
# BUILD file of //sdk and //worker/runtime)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sources=0
builds=0
for file in "$@"; do
  case "${file}" in
    */BUILD | BUILD) builds=$((builds + 1)) ;;
    *.h | *.cc) sources=$((sources + 1)) ;;
    *) continue ;;
  esac
  # grep -n prints "LINE:TEXT" for each offending line.
  while IFS= read -r hit; do
    [[ -n "${hit}" ]] && fail "${file}:${hit%%:*} builds on the trainer: ${hit#*:}"
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]worker/train/|"//worker/train[:/"]' \
    "${file}")
done
# An empty or partial list would pass vacuously.
((sources >= 20 && builds == 2)) &&
  pass "checked ${sources} sources and ${builds} BUILD files of sdk/ and worker/runtime/" ||
  fail "expected the sources and both BUILD files of sdk/ and worker/runtime/, got ${sources} sources and ${builds} BUILD files"
finish
