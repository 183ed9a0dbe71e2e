#!/usr/bin/env bash
# An elastic transformer LM job (examples/transformer_lm_ddp.textproto's
# model, 3 ranks on 5 local slots, hang_detection RESTART) trained twice with
# `chorus up`: undisturbed, then with two ranks killed (kill -9, at about a
# quarter and half of the steps) and one frozen (SIGSTOP, at about
# three quarters: DEAD after 3 s, evicted, replaced). Prints both runs'
# final train loss, test loss and parameter fingerprint, and one benchmark
# JSON line (docs/benchmarks.md); exits 1 unless the disturbed run SUCCEEDED
# with the undisturbed run's parameters. Run it beside busy loops with
# tests/under_load.sh:
#   bazel build //client:chorus
#   tests/under_load.sh --loops 2 --command 'tools/elastic_lm_chaos.sh bazel-bin/client/chorus'
# (docs/benchmarks.md, "Under load: two kills and a freeze").
set -u
CHORUS=$(realpath "$1")
WORK=$(mktemp -d)
trap 'rm -rf "${WORK}"' EXIT
export CHORUS_GLOO_SHM=1
PY=${CHORUS_TEST_PYTHON:-python3}

spec() {  # $1 = extra fields
  cat <<SPEC
name: "lm-chaos"
model { transformer_lm { vocab_size: 64 context_length: 32 d_model: 64 num_heads: 4 num_layers: 2 } }
data { synthetic { kind: TOKENS num_samples: 4096 } }
training { batch_size_per_rank: 32 epochs: 6 seed: 1 log_every_steps: 10 }
optimizer { kind: ADAMW lr: 0.003 weight_decay: 0.01 }
lr_schedule { cosine { warmup_steps: 20 } }
grad_clip_norm: 1.0
strategy { ddp {} }
resources { min_ranks: 3 max_ranks: 3 threads_per_rank: 1 }
elastic { max_restarts: 5 wait_seconds: 120 }
hang_detection { action: RESTART dead_after_seconds: 3 }
$1
SPEC
}
field() { "${PY}" -c 'import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"; }
final_crc() { cat "$1"/*.trace 2>/dev/null | awk '$1 == "final" { print $5 }' | sort -u | tr '\n' ' '; }
top_step() { cat "$1"/*.trace 2>/dev/null | awk '$1 == "step" && $4 > m { m = $4 } END { print m + 0 }'; }
# A live rank process of the newest generation (trace files are per pid).
live_rank() {
  local f pid gen best="" best_gen=0
  for f in "$1"/*.trace; do
    pid=$(basename "${f}" .trace)
    kill -0 "${pid}" 2>/dev/null && ! grep -q '^final' "${f}" || continue
    gen=$(awk '$1 == "step" { g = $2 } END { print g + 0 }' "${f}")
    (( gen >= best_gen )) && { best=${pid}; best_gen=${gen}; }
  done
  echo "${best}"
}

# --- undisturbed
mkdir -p "${WORK}/ref_trace" "${WORK}/trace"
spec "" >"${WORK}/ref.textproto"
start=${SECONDS}
ref=$(CHORUS_SAMPLE_TRACE="${WORK}/ref_trace" timeout 900 "${CHORUS}" up --local 3 \
  --state_dir "${WORK}/ref" "${WORK}/ref.textproto" --json 2>"${WORK}/ref.err" | tail -n 1)
ref_seconds=$((SECONDS - start))
total=$(top_step "${WORK}/ref_trace")
echo "undisturbed: $(field "${ref}" state) in ${ref_seconds} s, ${total} steps, train loss $(field "${ref}" final_metrics.train_loss), test loss $(field "${ref}" final_metrics.test_loss), parameters $(final_crc "${WORK}/ref_trace")"

# --- two kills and a freeze
spec "" >"${WORK}/chaos.textproto"
start=${SECONDS}
CHORUS_SAMPLE_TRACE="${WORK}/trace" timeout 900 "${CHORUS}" up --local 5 \
  --state_dir "${WORK}/chaos" "${WORK}/chaos.textproto" --json >"${WORK}/up.out" 2>"${WORK}/up.err" &
up=$!
for event in KILL:2 KILL:4 STOP:6; do  # the signal, and at how many eighths of the steps
  signal=${event%:*}
  at=$(( total * ${event#*:} / 8 ))
  for _ in $(seq 1 1800); do  # at most 900 s
    (( $(top_step "${WORK}/trace") >= at )) || ! kill -0 "${up}" 2>/dev/null && break
    sleep 0.5
  done
  victim=$(live_rank "${WORK}/trace")
  [[ -n "${victim}" ]] && kill "-${signal}" "${victim}" \
    && echo "step $(top_step "${WORK}/trace") of ${total}: SIG${signal} to rank process ${victim}"
done
wait "${up}"
chaos_seconds=$((SECONDS - start))
out=$(tail -n 1 "${WORK}/up.out")
history=$(grep -ho "generation [0-9]* after [^:]*" "${WORK}/up.err" "${WORK}"/chaos/*.log* 2>/dev/null | sort -u)
echo "disturbed: $(field "${out}" state) in ${chaos_seconds} s, train loss $(field "${out}" final_metrics.train_loss), test loss $(field "${out}" final_metrics.test_loss), parameters $(final_crc "${WORK}/trace")"
echo "${history}"
ok=false
[[ "$(field "${out}" state)" == SUCCEEDED && "$(final_crc "${WORK}/trace")" == "$(final_crc "${WORK}/ref_trace")" ]] && ok=true
printf '{"bench": "elastic_lm_chaos", "metric": "wall seconds of an elastic transformer LM job with two ranks killed and one frozen", "unit": "s", "ours": %s, "peer": %s, "peer_name": "the same job undisturbed, same run", "ratio": %s, "same_parameters": %s}\n' \
  "${chaos_seconds}" "${ref_seconds}" "$(awk -v a="${chaos_seconds}" -v b="${ref_seconds}" 'BEGIN { printf "%.2f", a / b }')" "${ok}"
${ok}
