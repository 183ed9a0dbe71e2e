#!/usr/bin/env bash
# End to end through `chorus up --local 2`: a TorchScript module exported by
# Python (examples/torchscript/export_model.py) trains on a torch.save tensor
# file, both named by paths relative to the user's directory; the built-in
# transformer_lm learns the synthetic token chain, with DDP on 2 ranks and with
# decentralized gossip (AccumAdamW) on 4.
#
# Usage (from Bazel): models_e2e_test.sh CHORUS EXPORT_SCRIPT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
EXPORT=$(realpath "$2")
PYTHON=/usr/bin/python3  # Debian's python3-torch
# Reads field $2 of the JSON line $1 (`chorus up --json` ends with one).
field() { json_get - "$2" <<<"$1"; }

work="${TMP}/user"
mkdir -p "${work}/models" "${work}/data"
# A labelled tensor file the way a user writes one: 28x28 images whose class
# is the quadrant holding the brightest blob.
"${PYTHON}" - "${work}/data" <<'PY' || fail "writing the tensor files"
import sys, torch
torch.manual_seed(3)
def make(n):
    x = torch.randn(n, 1, 28, 28) * 0.1
    y = torch.randint(0, 4, (n,))
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, r * 14 + 4:r * 14 + 10, c * 14 + 4:c * 14 + 10] += 1.0
    return {'x': x, 'y': y}
torch.save(make(1024), sys.argv[1] + '/train.pt')
torch.save(make(256), sys.argv[1] + '/eval.pt')
PY
"${PYTHON}" "${EXPORT}" "${work}/models/fashion_mlp.pt" >/dev/null || fail "export_model.py"

cat > "${work}/script.textproto" <<'SPEC'
name: "script"
model { torchscript { path: "models/fashion_mlp.pt" } }
data { tensor_file { path: "data/train.pt" eval_path: "data/eval.pt" } }
training { batch_size_per_rank: 32 epochs: 2 seed: 1 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
SPEC
# Relative paths resolve against the directory chorus runs in, not the agent's.
out=$(cd "${work}" && timeout 120 "${CHORUS}" up --local 2 --state_dir "${TMP}/script_state" script.textproto --json 2>"${TMP}/script.err"); rc=$?
last=$(echo "${out}" | tail -n 1)
if [[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 32 ]]; then
  pass "TorchScript job succeeded: ${last}"
else
  fail "TorchScript job rc=${rc} out='${out}' err=$(tail -5 "${TMP}/script.err")"
fi
acc=$(field "${last}" final_metrics.test_accuracy)
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.9) }' && pass "TorchScript test accuracy ${acc} > 0.9" \
  || fail "TorchScript test accuracy '${acc}' not above 0.9"

# A file that is not TorchScript fails the job with the path in the reason.
echo "not a model" > "${work}/models/broken.pt"
sed 's|models/fashion_mlp.pt|models/broken.pt|' "${work}/script.textproto" > "${work}/broken.textproto"
out=$(cd "${work}" && timeout 120 "${CHORUS}" up --local 2 --state_dir "${TMP}/broken_state" broken.textproto --json 2>"${TMP}/broken.err"); rc=$?
last=$(echo "${out}" | tail -n 1)
[[ ${rc} -eq 1 && "$(field "${last}" state)" == FAILED && "$(field "${last}" reason)" == *"cannot load ${work}/models/broken.pt"* ]] \
  && pass "a broken TorchScript file fails the job naming it" \
  || fail "broken model rc=${rc} out='${last}'"

# lm_job NAME RANKS "STRATEGY AND OPTIMIZER": a small transformer_lm on the
# synthetic token chain through `chorus up --local RANKS`. The chain's best
# next-token accuracy is about 0.7; guessing gets 1/32.
lm_job() {
  local name=$1 ranks=$2 extra=$3 out last acc rc
  cat > "${TMP}/${name}.textproto" <<SPEC
name: "${name}"
model { transformer_lm { vocab_size: 32 context_length: 16 d_model: 32 num_heads: 2 num_layers: 1 } }
data { synthetic { kind: TOKENS num_samples: 1024 } }
training { batch_size_per_rank: $((32 / ranks)) epochs: 2 seed: 1 }
resources { min_ranks: ${ranks} max_ranks: ${ranks} }
${extra}
SPEC
  out=$(timeout 180 "${CHORUS}" up --local "${ranks}" --state_dir "${TMP}/${name}_state" "${TMP}/${name}.textproto" --json 2>"${TMP}/${name}.err"); rc=$?
  last=$(echo "${out}" | tail -n 1)
  acc=$(field "${last}" final_metrics.test_accuracy)
  [[ ${rc} -eq 0 ]] && awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.5 && a < 0.8) }' \
    && pass "${name} on ${ranks} ranks: next-token accuracy ${acc}" \
    || fail "${name} rc=${rc} acc='${acc}' out='${last}' err=$(tail -5 "${TMP}/${name}.err")"
}
lm_job lm 2 "optimizer { kind: ADAMW lr: 0.01 }"
# Decentralized gossip with AccumAdamW; evaluation sees the global average.
lm_job lm-gossip 4 "optimizer { kind: ACCUM_ADAMW lr: 0.01 accum_iter: 2 } strategy { decentralized { topology: ONE_PEER_EXPONENTIAL } }"

assert_no_leftovers "every job"
finish
