#!/usr/bin/env bash
# Accuracy parity of decentralized training with DDP: the Fashion-MNIST MLP
# example (examples/fashion_mnist_mlp_decentralized.textproto: 784-256-128-10,
# batch 64 per rank, SGD momentum 0.9, cosine LR, 5 epochs = 1170 steps) on 4
# local ranks with `chorus up --local 4`, three times with only the strategy
# changed: DDP, decentralized RING, decentralized ONE_PEER_EXPONENTIAL. Same
# steps, same data order, same seed. Decentralized test accuracy is that of
# the exact global average of the ranks' models (what evaluation uses).
#
# Target: each decentralized accuracy within 1 point (0.01) of DDP's.
# Last line (docs/benchmarks.md): ours = the lower decentralized accuracy, peer =
# DDP's, ratio = ours / peer.
#
# Usage: tests/bench/decentralized_accuracy.sh   (build //client:chorus first)
set -uo pipefail
cd "$(dirname "$0")/../.."
CHORUS=${CHORUS:-bazel-bin/client/chorus}
[[ -x "${CHORUS}" ]] || { echo "build it first: bazel build //client:chorus" >&2; exit 2; }
SPEC=examples/fashion_mnist_mlp_decentralized.textproto
TMP=$(mktemp -d)
trap 'rm -rf "${TMP}"' EXIT

accuracy() {  # $1 = name, $2 = strategy line
  local spec="${TMP}/$1.textproto"
  sed "s/^strategy {.*/strategy { $2 }/" "${SPEC}" >"${spec}"
  local start=${SECONDS}
  if ! timeout 1800 "${CHORUS}" up --local 4 "${spec}" --json >"${TMP}/$1.out" 2>"${TMP}/$1.err"; then
    echo "$1 failed:" >&2
    tail -n 20 "${TMP}/$1.err" >&2
    echo null
    return
  fi
  local acc
  acc=$(tail -n 1 "${TMP}/$1.out" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["final_metrics"]["test_accuracy"])')
  echo "$1: test accuracy ${acc} ($((SECONDS - start)) s)" >&2
  echo "${acc}"
}

ddp=$(accuracy ddp "ddp { bucket_cap_mb: 25 }")
ring=$(accuracy ring "decentralized { topology: RING }")
exp=$(accuracy one_peer_exponential "decentralized { topology: ONE_PEER_EXPONENTIAL }")
worst=$(awk -v a="${ring}" -v b="${exp}" 'BEGIN { if (a == "null" || b == "null") print "null"; else print (a < b ? a : b) }')
echo "DDP ${ddp}, ring ${ring}, one_peer_exponential ${exp}"
verdict=$(awk -v d="${ddp}" -v w="${worst}" 'BEGIN { if (d == "null" || w == "null") print "n/a"; else if (d - w <= 0.01) print "MET"; else print "NOT MET" }')
echo "target: within 0.01 of DDP -> ${verdict}"
ratio=$(awk -v d="${ddp}" -v w="${worst}" 'BEGIN { if (d == "null" || w == "null" || d == 0) print "null"; else printf "%.4f", w / d }')
printf '{"bench": "decentralized_accuracy", "metric": "fashion_mnist_mlp_test_accuracy_4_ranks", "unit": "accuracy", "ours": %s, "peer": %s, "peer_name": "Chorus DDP, same steps", "ratio": %s}\n' \
  "${worst}" "${ddp}" "${ratio}"
[[ "${verdict}" == MET ]]
