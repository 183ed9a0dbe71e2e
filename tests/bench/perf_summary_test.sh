#!/usr/bin/env bash
# tests/bench/perf_summary.py on made-up bench logs, shaped as the benches
# print them: every target met; then figures over and under their bounds, a
# bench whose log lacks its figures, and a failed bench. Prints
# 'N passed, M failed' last.
set -uo pipefail
script=${1:-tests/bench/perf_summary.py}
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/perf_summary.XXXXXX")
trap 'rm -rf "${dir}"' EXIT
passed=0
failed=0
expect() {  # $1 = what, $2 = a fixed string the output must hold (runs of spaces as one)
  if tr -s ' ' <"${dir}/out" | grep -qF -- "$(tr -s ' ' <<<"$2")"; then
    passed=$((passed + 1))
  else
    echo "FAIL: $1: no line with '$2' in:"
    sed 's/^/    /' "${dir}/out"
    failed=$((failed + 1))
  fi
}

# $1 = folder, $2 = 25 MB ratio, $3 = 25 MB faults per op, $4 = big MLP step ms
# (compute alone is 80 ms), $5 = upload ratio.
write_logs() {
  mkdir -p "$1"
  cat >"$1/allreduce.log" <<LOG
machine: cores=2 page_reporting_order=9 first_touch_us_per_page=1.9
allreduce 1MB: ours 0.40 ms (0.39 ms CPU), raw gloo 1.70 ms
{"bench": "allreduce_1MB", "metric": "median_time_per_allreduce", "unit": "ms", "ours": 0.400, "peer": 1.700, "peer_name": "raw gloo::allreduce", "ratio": 0.2353, "ours_page_faults_per_op": 0.0, "peer_page_faults_per_op": 0.0}
{"bench": "allreduce_100MB", "metric": "median_time_per_allreduce", "unit": "ms", "ours": 30.000, "peer": 100.000, "peer_name": "raw gloo::allreduce", "ratio": 0.3000, "ours_page_faults_per_op": 0.0, "peer_page_faults_per_op": 0.0}
{"bench": "allreduce_25MB", "metric": "median_time_per_allreduce", "unit": "ms", "ours": 8.000, "peer": 20.000, "peer_name": "raw gloo::allreduce", "ratio": $2, "ours_page_faults_per_op": $3, "peer_page_faults_per_op": 0.0}
LOG
  cat >"$1/ddp.log" <<LOG
{"bench": "ddp_mlp_small", "metric": "median_step_time", "unit": "ms", "ours": 18.000, "peer": 30.000, "peer_name": "PyTorch DDP 1.13 (gloo)", "ratio": 0.6000, "compute_only_ms": 12.000, "two_processes_compute_only_ms": 15.000, "interleaved_step_ms": 19.000, "interleaved_compute_ms": 15.200, "ours_page_faults_per_step": 0.0}
{"bench": "ddp_mlp_big", "metric": "median_step_time", "unit": "ms", "ours": $4, "peer": 140.000, "peer_name": "PyTorch DDP 1.13 (gloo)", "ratio": $(awk -v s="$4" 'BEGIN { printf "%.4f", s / 140 }'), "compute_only_ms": 80.000, "two_processes_compute_only_ms": 80.000, "ours_page_faults_per_step": 0.0}
LOG
  cat >"$1/gossip.log" <<'LOG'
target <= 0.75: MET
{"bench": "decentralized_bench", "metric": "step_time_4_ranks_1gbit_links", "unit": "ms", "ours": 366, "peer": 661, "peer_name": "Chorus DDP (gradient all-reduce, gloo)", "ratio": 0.5537}
LOG
  cat >"$1/checkpoint.log" <<LOG
target stall ratio <= 0.2: ratio 0.03 -> MET
target throughput ratio >= 0.8 of dd: upload to the coordinator $5 -> MET; storage SHARED_DIR 1.05 -> MET
{"bench": "checkpoint_bench", "metric": "upload_commit_MBps_vs_dd", "unit": "MB/s", "ours": 900, "peer": 1000, "peer_name": "dd conv=fsync", "ratio": $5}
{"bench": "checkpoint_bench", "metric": "shared_dir_write_commit_MBps_vs_dd", "unit": "MB/s", "ours": 1050, "peer": 1000, "peer_name": "dd conv=fsync", "ratio": 1.05}
{"bench": "checkpoint_bench", "metric": "training_stall_seconds_per_checkpoint", "unit": "s", "ours": 0.015, "peer": 0.5, "peer_name": "torch.save (python3-torch)", "ratio": 0.03}
LOG
}

# Every target met.
write_logs "${dir}/good" 0.4 0.0 90.0 0.9
python3 "${script}" "${dir}/good" allreduce,ddp,gossip,checkpoint "" >"${dir}/out" 2>&1
expect "all met: 14 figures, all met" '{"suite": "perf", "targets": 14, "met": 14, "not_met": [], "failed": []}'
expect "all met: the 25 MB ratio" 'all-reduce 25MB: ours / raw gloo           0.400  <= 0.5    MET'
expect "all met: step over compute (90 / 80)" 'DDP mlp_big: step / compute only           1.125  <= 1.3    MET'
expect "all met: step over compute timed in the same minutes (19 / 15.2), not 18 / 12" 'DDP mlp_small: step / compute only         1.250  <= 1.3    MET'
expect "all met: the upload is held to >= 0.8" 'checkpoint: upload+commit / dd             0.900  >= 0.8    MET'
expect "all met: SHARED_DIR, the bench's second line" 'checkpoint: SHARED_DIR write+commit / dd   1.050  >= 0.8    MET'
expect "all met: the stall, not the upload, from the bench's two lines" 'checkpoint: stall / torch.save             0.030  <= 0.2    MET'

# 25 MB over its bound with page churn, the big MLP's step 1.5x its compute
# (ratio 0.857, over 0.75 too), the upload under 0.8, the gossip log empty and
# the gossip bench failed.
write_logs "${dir}/bad" 0.55 12.5 120.0 0.7
: >"${dir}/bad/gossip.log"
python3 "${script}" "${dir}/bad" allreduce,ddp,gossip,checkpoint "gossip" >"${dir}/out" 2>&1
expect "bad: the 25 MB ratio" 'all-reduce 25MB: ours / raw gloo           0.550  <= 0.5    NOT MET'
expect "bad: page faults per op" 'all-reduce 25MB: our page faults per op   12.500  <= 0.5    NOT MET'
expect "bad: step over compute (120 / 80)" 'DDP mlp_big: step / compute only           1.500  <= 1.3    NOT MET'
expect "bad: a missing figure" 'gossip: step / DDP step on 1 Gbit/s      missing  <= 0.75   NOT MET'
expect "bad: the upload" 'checkpoint: upload+commit / dd             0.700  >= 0.8    NOT MET'
expect "bad: the JSON line names what missed and what failed" '"met": 8, "not_met": ["all-reduce 25MB: ours / raw gloo", "all-reduce 25MB: our page faults per op", "DDP mlp_big: ours / PyTorch DDP", "DDP mlp_big: step / compute only", "gossip: step / DDP step on 1 Gbit/s", "checkpoint: upload+commit / dd"], "failed": ["gossip"]}'

# Only the benches that ran are judged: ddp alone has four figures.
python3 "${script}" "${dir}/good" ddp "" >"${dir}/out" 2>&1
expect "only ddp: four figures" '{"suite": "perf", "targets": 4, "met": 4, "not_met": [], "failed": []}'

# Usage.
python3 "${script}" "${dir}/good" >"${dir}/out" 2>&1
expect "usage" 'Usage: perf_summary.py OUT_DIR BENCHES FAILED'

echo "${passed} passed, ${failed} failed"
((failed == 0))
