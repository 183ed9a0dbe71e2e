#!/usr/bin/env bash
# Checkpoints end to end with real processes: a job checkpoints to the
# coordinator; the same job killed with SIGKILL on every rank after its
# checkpoint is resumed from it and ends with parameters bit-identical to an
# uninterrupted run (dropout on, 2 rank processes); the checkpoint also
# resumes on 1 rank; `chorus export` writes a file Python's torch.load reads
# (and, for a TorchScript job, a module torch.jit.load reads);
# a damaged checkpoint is skipped with a warning event; the same with storage
# SHARED_DIR, with and without checkpoint.per_rank; CHECKPOINT_NOW.
#
# Usage (from Bazel): checkpoint_e2e_test.sh CHORUS COORDINATOR [PART]
#   PART: coordinator (the coordinator's storage, export, TorchScript),
#         per_rank_shared (decentralized per-rank, SHARED_DIR, CHECKPOINT_NOW)
#         or all (the default). Bazel runs the two parts as two targets, so
#         that neither takes two minutes.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
COORDINATOR=$(realpath "$2")
PART=${3:-all}
case ${PART} in
  coordinator|per_rank_shared|all) ;;
  *) echo "checkpoint_e2e_test: PART is coordinator, per_rank_shared or all, not '${PART}'" >&2; exit 2 ;;
esac
PYTHON=/usr/bin/python3  # Debian's python3-torch
STATE="${TMP}/state"
# `chorus up --json` ends with one JSON line; these read it.
field() { json_get - "$2" <<<"$1"; }
succeeded_after() { [[ "$(field "$1" state)" == SUCCEEDED && "$(field "$1" final_metrics.steps)" == "$2" ]]; }
failed_with() { [[ "$(field "$1" state)" == FAILED && "$(field "$1" reason)" == *"$2"* ]]; }
up() { timeout 180 "${CHORUS}" up --state_dir "${STATE}" "$@" --json 2>>"${TMP}/up.err" | tail -n 1; }

base='name: "ckpt"
model { mlp { hidden_sizes: [64] dropout: 0.2 } }
data { synthetic { num_samples: 1920 input_shape: [16] num_classes: 4 seed: 3 } }
training { batch_size_per_rank: 32 epochs: 3 seed: 5 log_every_steps: 10 }
optimizer { kind: ADAM lr: 0.003 }
lr_schedule { cosine { warmup_steps: 10 } }
checkpoint { every_steps: 30 keep_last: 0 }'
# 1920 / 64 = 30 steps per epoch, 90 in all.
# A checkpoint due while the previous one is still uploading is skipped (by
# design); 30 steps of this model take ~0.05 s, less than an upload with its
# fsyncs on a loaded machine. Runs whose checkpoint steps are checked sleep
# 0.02 s per step (rank 0; the others wait for it), which changes no value.
paced='fault_injection { faults { kind: SLOW rank: 0 at_step: 1 duration_seconds: 0.02 } }'
printf '%s\nresources { min_ranks: 2 max_ranks: 2 }\n%s\n' "${base}" "${paced}" > "${TMP}/two.textproto"
printf '%s\nresources { min_ranks: 1 max_ranks: 1 }\n' "${base}" > "${TMP}/one.textproto"
# The interrupted run: rank 0 slows down after the checkpoint at step 30 so
# that it is committed before both ranks are killed at step 50.
printf '%s\nresources { min_ranks: 2 max_ranks: 2 }\nfault_injection {\n  faults { kind: SLOW rank: 0 at_step: 31 duration_seconds: 0.05 }\n  faults { kind: CRASH rank: 0 at_step: 50 }\n  faults { kind: CRASH rank: 1 at_step: 50 }\n}\n' "${base}" > "${TMP}/killed.textproto"

# A coordinator on the same state directory (as `chorus up --state_dir` runs
# one: DIR/state) sees what the runs committed.
coordinator() {
  start_coordinator -s "${STATE}/state" || fail "no coordinator started on ${STATE}/state"
  coordinator_pid=${COORDINATOR_PID}
  addr=${COORDINATOR_ADDR}
}

if [[ ${PART} != per_rank_shared ]]; then
# --- job-000001: uninterrupted
last=$(up --local 2 "${TMP}/two.textproto")
succeeded_after "${last}" 90 && pass "uninterrupted run: ${last}" \
  || fail "uninterrupted run: '${last}' $(tail -3 "${TMP}/up.err")"

# --- job-000002: every rank killed with SIGKILL at step 50
last=$(up --local 2 "${TMP}/killed.textproto")
failed_with "${last}" "killed by signal 9" && pass "interrupted run was killed" \
  || fail "killed run: '${last}'"

coordinator
ckpts=$("${CHORUS}" --coordinator "${addr}" checkpoints job-000002 2>&1)
full_ckpts=$("${CHORUS}" --coordinator "${addr}" checkpoints job-000001 --json 2>&1)
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
[[ "${ckpts}" == *"STEP"*$'\n'"30 "* && "${ckpts}" != *$'\n'"60 "* ]] && pass "the killed job has its step-30 checkpoint only" \
  || fail "checkpoints of job-000002: ${ckpts}"
json_has - 'checkpoints[*].step' 30 <<<"${full_ckpts}" && json_has - 'checkpoints[*].step' 60 <<<"${full_ckpts}" \
  && json_has - 'checkpoints[*].step' 90 <<<"${full_ckpts}" \
  && json_has - 'checkpoints[*].files[*].name' model.pt <<<"${full_ckpts}" \
  && json_get - 'checkpoints[*].files[*].crc32c' <<<"${full_ckpts}" >/dev/null \
  && pass "the uninterrupted job checkpointed at 30, 60 and at the end (90)" || fail "checkpoints of job-000001: ${full_ckpts}"
# Rank 0 sent them over the coordinator's checkpoint data port (raw TCP
# beside gRPC), not the Upload stream.
n=$(grep -c "job-000001 slot 0.*checkpoint step [0-9]*: sent [0-9]* bytes to the data port" "${STATE}/worker.log")
[[ "${n}" -eq 3 ]] && pass "rank 0 uploaded its 3 checkpoints over the checkpoint data port" \
  || fail "uploads over the data port in ${STATE}/worker.log: ${n}, expected 3"

# --- job-000003: resume job-000002 on 2 ranks
last=$(up --local 2 --resume_from job-000002 "${TMP}/two.textproto")
succeeded_after "${last}" 90 && pass "resumed run finished: ${last}" \
  || fail "resumed run: '${last}' $(tail -3 "${TMP}/up.err")"

# --- it really resumed: its first checkpoint is 60, and rank 0 said so
coordinator
resumed_ckpts=$("${CHORUS}" --coordinator "${addr}" checkpoints job-000003 2>&1)
[[ "${resumed_ckpts}" == *$'\n'"60 "* && "${resumed_ckpts}" == *$'\n'"90 "* && "${resumed_ckpts}" != *$'\n'"30 "* ]] \
  && pass "the resumed job started at step 30 (checkpoints 60 and 90 only)" || fail "resumed checkpoints: ${resumed_ckpts}"
# (The agent's log keeps every rank's output; `chorus up` leaves it in DIR.)
grep -q "job-000003: resuming from checkpoint job-000002 step 30" "${STATE}/worker.log" \
  && pass "rank 0 logged the resume" || fail "no resume line in ${STATE}/worker.log"

# --- export both final models and compare them in Python
"${CHORUS}" --coordinator "${addr}" export job-000001 -o "${TMP}/full.pt" 2>"${TMP}/export.err" \
  && "${CHORUS}" --coordinator "${addr}" export job-000003 --step 90 -o "${TMP}/resumed.pt" 2>>"${TMP}/export.err" \
  && pass "exported both final models" || fail "export: $(cat "${TMP}/export.err")"
out=$("${CHORUS}" --coordinator "${addr}" export job-000002 --step 60 -o "${TMP}/none.pt" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"has no checkpoint at step 60"* ]] && pass "exporting a step that does not exist says so" \
  || fail "export of a missing step rc=${rc} out='${out}'"
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
cmp=$("${PYTHON}" - "${TMP}/full.pt" "${TMP}/resumed.pt" <<'PY' 2>&1
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
assert all(isinstance(t, torch.Tensor) for t in a.values())
diff = [k for k in a if not torch.equal(a[k], b[k])]
print("keys", ",".join(sorted(a)), "differing", len(diff), diff)
PY
)
[[ "${cmp}" == *"differing 0 []"* && "${cmp}" == *"1.weight"* ]] \
  && pass "torch.load reads the exports; parameters bit-identical after SIGKILL and resume (${cmp})" \
  || fail "comparison: ${cmp}"

# --- the same checkpoint resumes on 1 rank (the rest of its epoch re-sharded)
last=$(up --local 1 --resume_from job-000002:30 "${TMP}/one.textproto")
# 30 steps of 64 samples = epoch 1 done; 2 more epochs of 1920 / 32 = 60 steps.
succeeded_after "${last}" 150 && pass "2-rank checkpoint resumed on 1 rank: ${last}" \
  || fail "resume on 1 rank: '${last}'"

# --- a damaged checkpoint is skipped; with no older one the job fails saying why
printf 'garbage' >> "${STATE}/state/checkpoints/job-000002/000000000030/model.pt"
last=$(up --local 2 --resume_from job-000002 "${TMP}/two.textproto")
failed_with "${last}" "cannot resume from job-000002: job job-000002 has no usable checkpoint" \
  && pass "a damaged checkpoint is not loaded" || fail "damaged: '${last}'"

# --- a TorchScript job: export --torchscript writes the trained module
"${PYTHON}" - "${TMP}/net.pt" <<'PY' || fail "writing the TorchScript module"
import sys, torch
torch.manual_seed(0)
torch.jit.script(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))).save(sys.argv[1])
PY
printf 'name: "script"\nmodel { torchscript { path: "%s" } }\ndata { synthetic { num_samples: 512 input_shape: [16] num_classes: 4 seed: 3 } }\ntraining { batch_size_per_rank: 32 epochs: 1 }\noptimizer { kind: SGD lr: 0.1 }\nresources { min_ranks: 1 max_ranks: 1 }\n' \
  "${TMP}/net.pt" > "${TMP}/script.textproto"
last=$(up --local 1 "${TMP}/script.textproto")
job=$(field "${last}" job_id)
coordinator
"${CHORUS}" --coordinator "${addr}" export "${job}" --torchscript -o "${TMP}/trained.pt" 2>"${TMP}/export_ts.err" \
  && "${CHORUS}" --coordinator "${addr}" export "${job}" -o "${TMP}/trained_state.pt" 2>>"${TMP}/export_ts.err" \
  && pass "exported ${job} as a TorchScript module" || fail "export --torchscript of '${job}': $(cat "${TMP}/export_ts.err") ${last}"
out=$("${CHORUS}" --coordinator "${addr}" export job-000001 --torchscript -o "${TMP}/not_script.pt" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"did not train a TorchScript model"* && ! -e "${TMP}/not_script.pt" ]] \
  && pass "--torchscript of an MLP job says it has no module" || fail "export --torchscript of an MLP job rc=${rc} out='${out}'"
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
cmp=$("${PYTHON}" - "${TMP}/trained.pt" "${TMP}/trained_state.pt" "${TMP}/net.pt" <<'PY' 2>&1
import sys, torch
trained, state, initial = torch.jit.load(sys.argv[1]), torch.load(sys.argv[2]), torch.jit.load(sys.argv[3])
mine = trained.state_dict()
assert sorted(mine) == sorted(state), (sorted(mine), sorted(state))
same = all(torch.equal(mine[k], state[k]) for k in mine)
moved = any(not torch.equal(mine[k], initial.state_dict()[k]) for k in mine)
out = trained(torch.randn(2, 16))
print("same", same, "moved", moved, "out", tuple(out.shape))
PY
)
[[ "${cmp}" == *"same True moved True out (2, 4)"* ]] \
  && pass "torch.jit.load reads the module; it holds the checkpoint's trained weights (${cmp})" || fail "TorchScript export: ${cmp}"

fi  # coordinator storage

if [[ ${PART} != coordinator ]]; then
# --- decentralized, checkpoint.per_rank: every rank's own model, killed and resumed
job_of() { field "$1" job_id; }
# The SHARED_DIR resume below is compared with the uninterrupted run, which
# the first part runs and exports; alone, this part runs it itself.
if [[ ! -s "${TMP}/full.pt" ]]; then
  last=$(up --local 2 "${TMP}/two.textproto"); full_job=$(job_of "${last}")
  coordinator
  "${CHORUS}" --coordinator "${addr}" export "${full_job}" -o "${TMP}/full.pt" 2>"${TMP}/export.err" \
    && pass "uninterrupted run ${full_job} exported" || fail "uninterrupted run: '${last}' $(cat "${TMP}/export.err")"
  kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
fi
gossip="${base/checkpoint \{ every_steps: 30 keep_last: 0 \}/checkpoint { every_steps: 30 keep_last: 0 per_rank: true \}}
strategy { decentralized { topology: RING } }
resources { min_ranks: 2 max_ranks: 2 }"
printf '%s\n%s\n' "${gossip}" "${paced}" > "${TMP}/gossip.textproto"
printf '%s\nfault_injection {\n  faults { kind: SLOW rank: 0 at_step: 31 duration_seconds: 0.05 }\n  faults { kind: CRASH rank: 0 at_step: 50 }\n  faults { kind: CRASH rank: 1 at_step: 50 }\n}\n' \
  "${gossip}" > "${TMP}/gossip_killed.textproto"
last=$(up --local 2 "${TMP}/gossip.textproto"); g_full=$(job_of "${last}")
[[ "$(field "${last}" state)" == SUCCEEDED ]] && pass "per-rank gossip run ${g_full}" || fail "per-rank gossip run: '${last}' $(tail -3 "${TMP}/up.err")"
last=$(up --local 2 "${TMP}/gossip_killed.textproto"); g_killed=$(job_of "${last}")
[[ "$(field "${last}" reason)" == *"killed by signal 9"* ]] && pass "per-rank gossip run ${g_killed} killed at step 50" || fail "killed gossip run: '${last}'"
last=$(up --local 2 --resume_from "${g_killed}" "${TMP}/gossip.textproto"); g_resumed=$(job_of "${last}")
succeeded_after "${last}" 90 && pass "per-rank gossip run resumed as ${g_resumed}" \
  || fail "resumed gossip run: '${last}' $(tail -3 "${TMP}/up.err")"
coordinator
listing=$("${CHORUS}" --coordinator "${addr}" checkpoints "${g_killed}" --json 2>&1)
json_has - 'checkpoints[*].files[*].name' model.rank1.pt <<<"${listing}" \
  && json_has - 'checkpoints[*].per_rank' true <<<"${listing}" \
  && pass "a per-rank checkpoint holds every rank's files" || fail "per-rank listing: ${listing}"
ok=1
for r in 0 1; do
  "${CHORUS}" --coordinator "${addr}" export "${g_full}" --step 60 --rank "${r}" -o "${TMP}/g_full_${r}.pt" 2>>"${TMP}/export.err" \
    && "${CHORUS}" --coordinator "${addr}" export "${g_resumed}" --step 60 --rank "${r}" -o "${TMP}/g_resumed_${r}.pt" 2>>"${TMP}/export.err" || ok=0
done
"${CHORUS}" --coordinator "${addr}" export "${g_full}" -o "${TMP}/g_full_end.pt" 2>>"${TMP}/export.err" \
  && "${CHORUS}" --coordinator "${addr}" export "${g_resumed}" -o "${TMP}/g_resumed_end.pt" 2>>"${TMP}/export.err" || ok=0
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
[[ ${ok} -eq 1 ]] && pass "exported both ranks' models at step 60 and the final ones" || fail "per-rank export: $(tail -3 "${TMP}/export.err")"
cmp=$("${PYTHON}" - "${TMP}" <<'PY' 2>&1
import sys, torch
d = sys.argv[1]
load = lambda n: torch.load("%s/%s.pt" % (d, n))
same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a) and sorted(a) == sorted(b)
r0, r1 = load("g_full_0"), load("g_full_1")
print("ranks_differ", not same(r0, r1),
      "rank0_same", same(r0, load("g_resumed_0")), "rank1_same", same(r1, load("g_resumed_1")),
      "final_same", same(load("g_full_end"), load("g_resumed_end")))
PY
)
[[ "${cmp}" == *"ranks_differ True rank0_same True rank1_same True final_same True"* ]] \
  && pass "decentralized per-rank resume after SIGKILL: both ranks' models bit-identical to the uninterrupted run (${cmp})" \
  || fail "per-rank comparison: ${cmp}"

# --- storage SHARED_DIR: ranks write the files into the shared directory,
# the coordinator checks and commits them; SIGKILL and resume as above
SHARED="${TMP}/shared"
mkdir -p "${SHARED}"
shared_spec() { sed "s|checkpoint { every_steps: 30 keep_last: 0 }|checkpoint { every_steps: 30 keep_last: 0 storage: SHARED_DIR shared_dir: '$1' }|" "$2"; }
shared_spec "${SHARED}" "${TMP}/killed.textproto" > "${TMP}/shared_killed.textproto"
shared_spec "${SHARED}" "${TMP}/two.textproto" > "${TMP}/shared_two.textproto"
last=$(up --local 2 "${TMP}/shared_killed.textproto"); s_killed=$(job_of "${last}")
# Checkpoints go under the cluster's id (docs/checkpoints.md): the one
# directory the shared directory now holds.
CLUSTER=$(ls "${SHARED}")
[[ "${CLUSTER}" =~ ^[0-9a-f]{12}$ ]] && pass "SHARED_DIR: checkpoints under the cluster's id ${CLUSTER}" \
  || fail "SHARED_DIR: expected one cluster directory in ${SHARED}, found '${CLUSTER}'"
SPACE="${SHARED}/${CLUSTER}"
[[ "$(field "${last}" reason)" == *"killed by signal 9"* && -s "${SPACE}/${s_killed}/000000000030/model.pt" \
   && ! -e "${STATE}/state/checkpoints/${s_killed}" ]] \
  && pass "SHARED_DIR: ${s_killed}'s step-30 checkpoint is in the shared directory, not the coordinator's" \
  || fail "SHARED_DIR run: '${last}' $(ls -R "${SHARED}" 2>&1 | head -20) $(tail -3 "${TMP}/up.err")"
last=$(up --local 2 --resume_from "${s_killed}" "${TMP}/shared_two.textproto"); s_resumed=$(job_of "${last}")
succeeded_after "${last}" 90 && pass "SHARED_DIR: resumed as ${s_resumed}" \
  || fail "SHARED_DIR resume: '${last}' $(tail -3 "${TMP}/up.err")"
coordinator
listing=$("${CHORUS}" --coordinator "${addr}" checkpoints "${s_resumed}" --json 2>&1)
"${CHORUS}" --coordinator "${addr}" export "${s_resumed}" -o "${TMP}/shared_end.pt" 2>"${TMP}/export.err"; rc=$?
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
json_has - 'checkpoints[*].directory' "${SPACE}/${s_resumed}/000000000090" <<<"${listing}" \
  && ! json_get - 'checkpoints[*].files[*].sha256' <<<"${listing}" >/dev/null \
  && json_get - 'checkpoints[*].files[*].crc32c' <<<"${listing}" >/dev/null \
  && pass "SHARED_DIR: the manifest names the directory and records CRC-32C" || fail "SHARED_DIR listing: ${listing}"
cmp=$("${PYTHON}" - "${TMP}/full.pt" "${TMP}/shared_end.pt" <<'PY' 2>&1
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
print("differing", sorted(a) != sorted(b) or [k for k in a if not torch.equal(a[k], b[k])])
PY
)
[[ ${rc} -eq 0 && "${cmp}" == *"differing []"* ]] \
  && pass "SHARED_DIR: exported; bit-identical to the uninterrupted run after SIGKILL and resume" \
  || fail "SHARED_DIR export rc=${rc}: ${cmp} $(cat "${TMP}/export.err")"
# A damaged file in the shared directory is caught by its CRC-32C.
printf 'X' | dd of="${SPACE}/${s_killed}/000000000030/model.pt" bs=1 seek=100 conv=notrunc status=none
last=$(up --local 2 --resume_from "${s_killed}" "${TMP}/shared_two.textproto")
failed_with "${last}" "has no usable checkpoint" \
  && pass "SHARED_DIR: a damaged file is not loaded" || fail "SHARED_DIR damaged: '${last}'"
# A shared directory that is not there fails the job at start, naming it.
shared_spec "${TMP}/not-mounted" "${TMP}/two.textproto" > "${TMP}/shared_missing.textproto"
last=$(up --local 2 "${TMP}/shared_missing.textproto")
# This reason says "the coordinator's host", and `chorus up --json` writes the
# quote as \', which JSON does not allow (client/up.cc escapes the reason with
# absl::CHexEscape): while it does, the line is matched as text.
missing="checkpoint.shared_dir ${TMP}/not-mounted is not a directory"
if json_get - '' <<<"${last}" >/dev/null 2>&1; then
  failed_with "${last}" "${missing}"
else
  [[ "${last}" == *'"state": "FAILED"'* && "${last}" == *"${missing}"* ]]
fi \
  && pass "SHARED_DIR: a missing shared directory fails the job naming it" || fail "SHARED_DIR missing: '${last}'"

# --- per_rank + SHARED_DIR: both ranks write their own files into the shared
# directory, the coordinator checks both parts and commits them as one
# checkpoint; SIGKILL and resume; both models as in the uninterrupted run
per_rank_shared() { sed "s|checkpoint { every_steps: 30 keep_last: 0 per_rank: true }|checkpoint { every_steps: 30 keep_last: 0 per_rank: true storage: SHARED_DIR shared_dir: '${SHARED}' }|" "$1"; }
per_rank_shared "${TMP}/gossip_killed.textproto" > "${TMP}/gs_killed.textproto"
per_rank_shared "${TMP}/gossip.textproto" > "${TMP}/gs.textproto"
grep -q "per_rank: true storage: SHARED_DIR" "${TMP}/gs.textproto" || fail "could not write the per_rank SHARED_DIR spec"
last=$(up --local 2 "${TMP}/gs_killed.textproto"); gs_killed=$(job_of "${last}")
files=$(cd "${SPACE}/${gs_killed}/000000000030" 2>/dev/null && ls | tr '\n' ' ')
[[ "$(field "${last}" reason)" == *"killed by signal 9"* && "${files}" == *"model.pt "* && "${files}" == *"model.rank1.pt"* \
   && ! -e "${STATE}/state/checkpoints/${gs_killed}" && -z "$(ls -A "${SPACE}/${gs_killed}" | grep staging)" ]] \
  && pass "per_rank SHARED_DIR: ${gs_killed}'s step-30 checkpoint holds both ranks' files (${files}), no staging left" \
  || fail "per_rank SHARED_DIR run: '${last}' $(ls -aR "${SPACE}/${gs_killed}" 2>&1 | head -20) $(tail -3 "${TMP}/up.err")"
last=$(up --local 2 --resume_from "${gs_killed}" "${TMP}/gs.textproto"); gs_resumed=$(job_of "${last}")
succeeded_after "${last}" 90 \
  && pass "per_rank SHARED_DIR: resumed as ${gs_resumed}" || fail "per_rank SHARED_DIR resume: '${last}' $(tail -3 "${TMP}/up.err")"
coordinator
listing=$("${CHORUS}" --coordinator "${addr}" checkpoints "${gs_resumed}" --json 2>&1)
ok=1
for r in 0 1; do
  "${CHORUS}" --coordinator "${addr}" export "${gs_resumed}" --step 60 --rank "${r}" -o "${TMP}/gs_resumed_${r}.pt" \
    2>>"${TMP}/export.err" || ok=0
done
"${CHORUS}" --coordinator "${addr}" export "${gs_resumed}" -o "${TMP}/gs_resumed_end.pt" 2>>"${TMP}/export.err" || ok=0
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
[[ ${ok} -eq 1 ]] && json_has - 'checkpoints[*].directory' "${SPACE}/${gs_resumed}/000000000090" <<<"${listing}" \
  && json_has - 'checkpoints[*].per_rank' true <<<"${listing}" \
  && json_has - 'checkpoints[*].files[*].name' model.rank1.pt <<<"${listing}" \
  && pass "per_rank SHARED_DIR: listed in the shared directory with both ranks' files; exported" \
  || fail "per_rank SHARED_DIR listing/export: ${listing} $(tail -3 "${TMP}/export.err")"
cmp=$("${PYTHON}" - "${TMP}" <<'PY' 2>&1
import sys, torch
d = sys.argv[1]
load = lambda n: torch.load("%s/%s.pt" % (d, n))
same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a) and sorted(a) == sorted(b)
print("rank0_same", same(load("g_full_0"), load("gs_resumed_0")), "rank1_same", same(load("g_full_1"), load("gs_resumed_1")),
      "final_same", same(load("g_full_end"), load("gs_resumed_end")))
PY
)
[[ "${cmp}" == *"rank0_same True rank1_same True final_same True"* ]] \
  && pass "per_rank SHARED_DIR resume after SIGKILL: both ranks' models bit-identical to the uninterrupted run (${cmp})" \
  || fail "per_rank SHARED_DIR comparison: ${cmp}"

# --- CHECKPOINT_NOW: `chorus checkpoint JOB --wait` on a running job with no
# periodic checkpoints (DDP: rank 0 at the end of its step; decentralized:
# the ranks agree at a multiple of 10 steps)
for kind in ddp gossip; do
  spec="${base/checkpoint \{ every_steps: 30 keep_last: 0 \}/checkpoint { at_end: false \}}
resources { min_ranks: 2 max_ranks: 2 }
fault_injection { faults { kind: SLOW rank: 0 at_step: 1 duration_seconds: 0.08 } }"
  [[ ${kind} == gossip ]] && spec+=$'\nstrategy { decentralized { topology: RING } }'
  printf '%s\n' "${spec}" > "${TMP}/now_${kind}.textproto"
  rm -rf "${TMP}/now_state"
  timeout 180 "${CHORUS}" up --state_dir "${TMP}/now_state" --local 2 "${TMP}/now_${kind}.textproto" --json \
    >"${TMP}/now_${kind}.out" 2>"${TMP}/now_${kind}.err" &
  up_pid=$!
  now_addr=""
  # A few steps in: the ranks reported step 10 (every 10 steps), so the
  # checkpoint is not simply the state they started from. 80 steps of at
  # least 0.08 s (6.4 s) are left for the request to reach them.
  wait_for '[[ -s "${TMP}/now_state/port" ]] && now_addr="127.0.0.1:$(cat "${TMP}/now_state/port")"
            [[ -n "${now_addr}" ]] && (( $("${CHORUS}" --coordinator "${now_addr}" status job-000001 --json 2>/dev/null \
               | json_get - job.latest_metrics.step 2>/dev/null || echo 0) >= 10 ))' 60
  out=$("${CHORUS}" --coordinator "${now_addr}" checkpoint job-000001 --wait --wait_seconds 60 2>&1); rc=$?
  wait "${up_pid}"
  step=$(echo "${out}" | sed -n 's/.*checkpoint at step \([0-9]*\) committed.*/\1/p')
  final=$(tail -n 1 "${TMP}/now_${kind}.out")
  if [[ ${rc} -eq 0 && -n "${step}" && "$(field "${final}" state)" == SUCCEEDED ]] \
     && { [[ ${kind} == ddp ]] || (( step % 10 == 0 )); }; then
    pass "${kind}: chorus checkpoint --wait got a checkpoint at step ${step} ($(echo "${out}" | head -n 1))"
  else
    fail "${kind}: chorus checkpoint rc=${rc} out='${out}' final='${final}' $(tail -3 "${TMP}/now_${kind}.err")"
  fi
done

fi  # per-rank and SHARED_DIR storage, CHECKPOINT_NOW

assert_no_leftovers "every run"
finish
