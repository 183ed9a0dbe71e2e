#!/usr/bin/env bash
# tests/gpu/trace_summary.py on two small made-up traces (no GPU needed): the
# per-step figures of each side, and an extra kernel and runtime call on one
# side found in the difference, per step. Prints 'N passed, M failed' last.
set -uo pipefail
script=${1:-tests/gpu/trace_summary.py}
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/trace_summary.XXXXXX")
trap 'rm -rf "${dir}"' EXIT
passed=0
failed=0
expect() {  # $1 = what, $2 = a fixed string the output must hold
  if grep -qF -- "$2" "${dir}/out"; then
    passed=$((passed + 1))
  else
    echo "FAIL: $1: no line with '$2' in:"
    sed 's/^/    /' "${dir}/out"
    failed=$((failed + 1))
  fi
}

# 10 steps of 4 matrix products (100 us each, 10 us apart: 40 in 4390 us) on
# stream 7, one launch each; chorus_ddp adds 3 reductions of 19 us a step on
# stream 17, each with an event recorded on another thread.
python3 - "${dir}" <<'EOF'
import json, sys
def trace(path, extra):
    events, t = [], 0
    for step in range(10):
        for k in range(4):
            events.append({"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>(int)",
                           "pid": 0, "tid": 7, "ts": t, "dur": 100, "args": {"stream": 7}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1, "tid": 11, "ts": t, "dur": 5})
            t += 110
        for k in range(3 if extra else 0):
            events.append({"ph": "X", "cat": "kernel", "name": "oneRankReduce",
                           "pid": 0, "tid": 17, "ts": t - 400 + 100 * k, "dur": 19,
                           "args": {"stream": 17}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord",
                           "pid": 1, "tid": 12, "ts": t - 400, "dur": 2})
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)
trace(sys.argv[1] + "/chorus_ddp_mlp.json", True)
trace(sys.argv[1] + "/pytorch_ddp_mlp.json", False)
EOF

python3 "${script}" "${dir}" mlp > "${dir}/out" 2>&1
rc=$?
[[ ${rc} -eq 0 ]] && passed=$((passed + 1)) || { echo "FAIL: exit status ${rc}"; failed=$((failed + 1)); }
expect "each side's GPU span per step" "GPU span 439.0 us/step over 10 steps"
expect "the training stream's busy and idle time" \
  "stream 7: 4 ops/step, busy 400.0 us/step, idle between its ops 39.0 us/step"
expect "the second stream" "stream 17: 3 ops/step, busy 57.0 us/step"
expect "GPU work per step by kernel" "57.0    3.0  kernel oneRankReduce"
expect "runtime calls per step" "20.0    4.0  cudaLaunchKernel"
expect "a side with no trace" "pytorch_plain_mlp.json: missing"
expect "the difference's title" "== chorus_ddp - pytorch_ddp"
expect "the extra kernel in the difference" "gpu     +57.0   +3.0  kernel oneRankReduce"
expect "the extra runtime call in the difference" "host      +6.0   +3.0  cudaEventRecord"
if grep -qF "cudaLaunchKernel" <(sed -n '/== chorus_ddp - pytorch_ddp/,$p' "${dir}/out"); then
  echo "FAIL: what both sides do alike is listed as a difference"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
python3 "${script}" > "${dir}/out" 2>&1
rc=$?
[[ ${rc} -eq 2 ]] && passed=$((passed + 1)) ||
  { echo "FAIL: without arguments the exit status is ${rc}, not 2"; failed=$((failed + 1)); }
expect "usage without arguments" "Usage: trace_summary.py DIR MODEL [STEPS]"

echo "${passed} passed, ${failed} failed"
[[ ${failed} -eq 0 ]]
