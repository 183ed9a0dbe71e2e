#!/usr/bin/env bash
# Decentralized benchmark: gossip averaging (ring, one_peer_exponential)
# against DDP's gradient all-reduce on a slow network, in the same run.
#
# The network: 4 ranks, each in its own network namespace, joined by veth
# pairs to a Linux bridge in a fifth namespace. Every veth end has a tbf
# qdisc of RATE (default 1gbit), so each rank sends and receives at most RATE.
# Addresses 10.79.0.1-4 exist only inside those namespaces. (netem, which
# would add delay, is not available on this kernel; the links are rate-
# limited only.)
#
# The job: an MLP 784-H-...-10 (default H = 2048,2048,2048: 10.1 M
# parameters, 40 MB of float32), batch 64 per rank, SGD, one thread per rank,
# fixed random data; the same model, data and thread count for every
# strategy. Each rank (worker/decentralized/decentralized_bench_rank) times
# STEPS steps after WARMUP, without per-step barriers, ending with a barrier
# that waits for every exchange in flight; the figure is rank 0's mean step
# time. Also run: "none" (no communication: the compute floor on this
# machine, 4 ranks sharing its cores) and bytes sent per rank per step,
# measured from the veth's tx_bytes counter (TCP/IP overhead included).
#
# Last line (docs/benchmarks.md): ratio = decentralized step time (the faster of
# ring and one_peer_exponential) / DDP step time. Target <= 0.75.
#
# Usage (root; from any directory):
#   tests/bench/decentralized_bench.sh [--runs N] [--steps S] [--rate 1gbit] [--hidden 2048,2048,2048]
# Environment: RANK_BIN (default bazel-bin/worker/decentralized/decentralized_bench_rank).
set -uo pipefail
cd "$(dirname "$0")/../.."

runs=1
steps=20
warmup=3
rate=1gbit
hidden=2048,2048,2048
while (($#)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
((runs >= 1 && runs <= 10)) || { echo "--runs must be in 1..10" >&2; exit 2; }
((steps >= 2 && steps <= 500)) || { echo "--steps must be in 2..500" >&2; exit 2; }
RANK_BIN=${RANK_BIN:-bazel-bin/worker/decentralized/decentralized_bench_rank}
[[ -x "${RANK_BIN}" ]] || { echo "build it first: bazel build -c opt //worker/decentralized:decentralized_bench_rank" >&2; exit 2; }
RANK_BIN=$(realpath "${RANK_BIN}")
# What changes the result on this machine (bazel build //common:machine-facts).
FACTS_BIN=${FACTS_BIN:-bazel-bin/common/machine-facts}
[[ -x "${FACTS_BIN}" ]] && echo "machine: $("${FACTS_BIN}")" >&2
N=4
TMP=$(mktemp -d)
tag="cdb$$"
sw="${tag}-sw"
cleanup() {
  for i in $(seq 0 $((N - 1))); do
    ip netns pids "${tag}-r${i}" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "${tag}-r${i}" 2>/dev/null
  done
  ip netns del "${sw}" 2>/dev/null
  rm -rf "${TMP}"
}
trap cleanup EXIT

ip netns add "${sw}" || { echo "cannot create network namespaces (needs root and iproute2)" >&2; exit 1; }
ip -n "${sw}" link add br0 type bridge
ip -n "${sw}" link set br0 up
for i in $(seq 0 $((N - 1))); do
  ns="${tag}-r${i}"
  ip netns add "${ns}"
  ip link add "${tag}r${i}" type veth peer name "${tag}s${i}"
  ip link set "${tag}r${i}" netns "${ns}"
  ip link set "${tag}s${i}" netns "${sw}"
  ip -n "${ns}" addr add "10.79.0.$((i + 1))/24" dev "${tag}r${i}"
  ip -n "${ns}" link set "${tag}r${i}" up
  ip -n "${ns}" link set lo up
  ip -n "${sw}" link set "${tag}s${i}" master br0
  ip -n "${sw}" link set "${tag}s${i}" up
  # Egress of the rank and egress towards the rank: RATE each way.
  ip netns exec "${ns}" tc qdisc add dev "${tag}r${i}" root tbf rate "${rate}" burst 256kb latency 100ms || exit 1
  ip netns exec "${sw}" tc qdisc add dev "${tag}s${i}" root tbf rate "${rate}" burst 256kb latency 100ms || exit 1
done

tx_bytes() { ip netns exec "${tag}-r$1" cat "/sys/class/net/${tag}r$1/statistics/tx_bytes"; }

# run STRATEGY -> prints "ms_per_step bytes_per_step params" (rank 0), or fails.
run() {
  local strategy=$1 dir="${TMP}/$1.$RANDOM" pids=() before after
  mkdir -p "${dir}"
  before=$(tx_bytes 0)
  for i in $(seq 0 $((N - 1))); do
    ip netns exec "${tag}-r${i}" timeout 600 "${RANK_BIN}" --strategy "${strategy}" --rank "${i}" --size "${N}" \
      --store "${dir}" --host "10.79.0.$((i + 1))" --steps "${steps}" --warmup "${warmup}" --hidden "${hidden}" \
      >"${dir}/log.${i}" 2>&1 &
    pids+=($!)
  done
  local ok=1
  for p in "${pids[@]}"; do wait "${p}" || ok=0; done
  after=$(tx_bytes 0)
  if ((ok == 0)) || [[ ! -s "${dir}/result.0" ]]; then
    echo "${strategy} failed:" >&2
    cat "${dir}"/log.* >&2
    return 1
  fi
  read -r ms params <"${dir}/result.0"
  echo "${ms} $(((after - before) / (steps + warmup))) ${params}"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "null"; else print v[int((NR + 1) / 2)] }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || b == 0) print "null"; else printf "%.3f", a / b }'; }

declare -A MS BYTES
params=0
failed=0
for r in $(seq 1 "${runs}"); do
  for strategy in none ddp ring one_peer_exponential; do
    if out=$(run "${strategy}"); then
      read -r ms bytes params <<<"${out}"
      MS[${strategy}]+="${ms} "
      BYTES[${strategy}]+="${bytes} "
      echo "run ${r} ${strategy}: ${ms} ms/step, ${bytes} bytes sent per rank per step"
    else
      failed=1
    fi
  done
done

m() { median ${MS[$1]:-}; }
b() { median ${BYTES[$1]:-}; }
ddp=$(m ddp)
ring=$(m ring)
exp=$(m one_peer_exponential)
best=$(awk -v a="${ring}" -v b="${exp}" 'BEGIN { if (a == "null") print b; else if (b == "null") print a; else print (a < b ? a : b) }')
echo
echo "4 ranks, links ${rate} each way, MLP 784-${hidden//,/-}-10 (${params} parameters), batch 64/rank, ${steps} steps, medians over ${runs} run(s)"
printf '  %-22s %10s %14s\n' strategy ms/step bytes/rank/step
for s in none ddp ring one_peer_exponential; do printf '  %-22s %10s %14s\n' "${s}" "$(m "${s}")" "$(b "${s}")"; done
echo "  ring / ddp: $(div "${ring}" "${ddp}")   one_peer_exponential / ddp: $(div "${exp}" "${ddp}")"
ratio=$(div "${best}" "${ddp}")
echo "target <= 0.75: $(awk -v r="${ratio}" 'BEGIN { if (r == "null") print "n/a"; else if (r + 0 <= 0.75) print "MET"; else print "NOT MET" }')"
printf '{"bench": "decentralized_bench", "metric": "step_time_4_ranks_%s_links", "unit": "ms", "ours": %s, "peer": %s, "peer_name": "Chorus DDP (gradient all-reduce, gloo)", "ratio": %s}\n' \
  "${rate}" "${best}" "${ddp}" "${ratio}"
exit "${failed}"
