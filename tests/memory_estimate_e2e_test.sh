#!/usr/bin/env bash
# The memory estimate (common/memory_estimate.h) against what a rank really
# holds: each built-in model at a small and a large size trains a few steps
# and evaluates as a 1-rank job through `chorus up --local 1`; the rank's
# trainer reports its peak resident memory (final_metrics.peak_rss_bytes,
# VmHWM), `chorus validate` prints the estimate, and peak / estimate must lie
# in [0.67, 1.5]. docs/benchmarks.md ("Memory per rank") has the figures.
#
# Usage: memory_estimate_e2e_test.sh CHORUS [NAME,NAME...]
# With names (or CHORUS_MEMORY_CASES=NAME,NAME), only those cases run: Bazel
# runs the seven as three targets, none of them two minutes long.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
CHORUS_MEMORY_CASES=${2:-${CHORUS_MEMORY_CASES:-}}

# The estimate `chorus validate FILE` prints ("a rank needs about 1.7 GB
# (...)"), in bytes.
estimate_bytes() {
  "${CHORUS}" validate "$1" 2>&1 | sed -n 's/.*a rank needs about \([0-9.]*\) \([kMGT]*B\).*/\1 \2/p' |
    awk '{ m = ($2 == "kB") ? 1e3 : ($2 == "MB") ? 1e6 : ($2 == "GB") ? 1e9 : ($2 == "TB") ? 1e12 : 1;
           printf "%.0f\n", $1 * m }'
}

# measure NAME "MODEL, DATA, TRAINING AND OPTIMIZER BLOCKS": runs the job,
# checks peak / estimate, and prints one line of the benchmarks table.
measure() {
  local name=$1 body=$2 spec out last rc peak estimate
  if [[ -n "${CHORUS_MEMORY_CASES:-}" && ",${CHORUS_MEMORY_CASES}," != *",${name},"* ]]; then
    return
  fi
  spec="${TMP}/${name}.textproto"
  printf 'name: "%s"\n%s\nresources { min_ranks: 1 max_ranks: 1 }\n' "${name}" "${body}" >"${spec}"
  estimate=$(estimate_bytes "${spec}")
  out=$(timeout "$(slack_seconds 120)" "${CHORUS}" up --local 1 --state_dir "${TMP}/${name}_state" \
    "${spec}" --json 2>"${TMP}/${name}.err"); rc=$?
  last=$(tail -n 1 <<<"${out}")
  peak=$(json_get - final_metrics.peak_rss_bytes <<<"${last}" 2>/dev/null)
  if [[ ${rc} -ne 0 || -z "${peak}" || -z "${estimate}" || "${estimate}" -le 0 ]]; then
    fail "${name}: rc=${rc} estimate='${estimate}' out='${last}' err=$(tail -3 "${TMP}/${name}.err")"
    return
  fi
  local ratio
  ratio=$(awk -v p="${peak}" -v e="${estimate}" 'BEGIN { printf "%.2f", p / e }')
  echo "| ${name} | $((peak / 1000000)) MB | $((estimate / 1000000)) MB | ${ratio} |"
  awk -v r="${ratio}" 'BEGIN { exit !(r >= 0.67 && r <= 1.5) }' \
    && pass "${name}: peak ${peak} / estimate ${estimate} = ${ratio}" \
    || fail "${name}: peak ${peak} / estimate ${estimate} = ${ratio}, outside [0.67, 1.5]"
}

echo "| job | peak RSS | estimate | peak / estimate |"
measure mlp-small 'model { mlp {} }
data { synthetic { num_samples: 1024 } }
training { batch_size_per_rank: 64 max_steps: 4 }'
measure mlp-large 'model { mlp { hidden_sizes: [4096, 4096] } }
data { synthetic { num_samples: 2048 input_shape: [3, 64, 64] } }
training { batch_size_per_rank: 256 max_steps: 3 }
optimizer { kind: ADAM }'
measure cnn-small 'model { cnn {} }
data { synthetic { num_samples: 1024 input_shape: [1, 28, 28] } }
training { batch_size_per_rank: 64 max_steps: 4 }'
measure cnn-large 'model { cnn { channels: [64, 128] fc_hidden: 512 } }
data { synthetic { num_samples: 1024 input_shape: [3, 64, 64] } }
training { batch_size_per_rank: 128 max_steps: 3 }
optimizer { kind: ADAM }'
measure lm-small 'model { transformer_lm {} }
data { synthetic { kind: TOKENS num_samples: 1024 } }
training { batch_size_per_rank: 32 max_steps: 4 }
optimizer { kind: ADAMW }'
# The size of issue 59: nanoGPT's vocabulary, a short context, a narrow model.
measure lm-vocab 'model { transformer_lm { vocab_size: 50304 context_length: 32 d_model: 64 } }
data { synthetic { kind: TOKENS num_samples: 1024 } }
training { batch_size_per_rank: 16 max_steps: 3 }
optimizer { kind: ADAMW }'
measure lm-large 'model { transformer_lm { vocab_size: 50304 context_length: 128 d_model: 256 num_heads: 8 num_layers: 4 } }
data { synthetic { kind: TOKENS num_samples: 160 } }
training { batch_size_per_rank: 16 max_steps: 2 }
optimizer { kind: ADAMW }'

assert_no_leftovers "every job"
finish
