#!/usr/bin/env bash
# End to end, sharded data (data.shards, docs/job-spec.md "Bring your
# dataset"; issue 42): a 4-rank elastic DDP job streams its samples from tar
# shards that Python's tarfile wrote (pax format, .npy members), and rank 1
# is killed with SIGKILL in the middle of epoch 1 while the agent has a spare
# slot. The job succeeds; the sample trace shows every sample of every epoch,
# the interrupted one included, trained exactly once; every rank ends with
# the parameters of an undisturbed run, bit for bit (the newcomer's reader
# and the survivors' re-started readers continue the streamed order where the
# shared position says).
#
# Usage (from Bazel): shards_elastic_e2e_test.sh CHORUS
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
field() { json_get - "$2" <<<"$1"; }
export CHORUS_GLOO_SHM=1  # the same summation order in every run (elastic_e2e_test.sh)

# 4 shards of 1024 samples: x float32 [16] (seeded Gaussian), y int64 the
# class a fixed linear teacher picks of 4; member names KEY.x.npy, KEY.y.npy.
mkdir -p "${TMP}/shards"
python3 - "${TMP}/shards" <<'PY' || fail "writing the shards"
import io, random, struct, sys, tarfile
def npy(descr, shape, data):
    dims = ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data
rng = random.Random(7)
teacher = [[rng.gauss(0, 1) for _ in range(4)] for _ in range(16)]
for shard in range(4):
    with tarfile.open("%s/train-%d.tar" % (sys.argv[1], shard), "w") as tar:
        for i in range(1024):
            x = [rng.gauss(0, 1) for _ in range(16)]
            scores = [sum(x[f] * teacher[f][c] for f in range(16)) for c in range(4)]
            y = scores.index(max(scores))
            for name, data in (("x", npy("<f4", (16,), struct.pack("<16f", *x))),
                               ("y", npy("<i8", (), struct.pack("<q", y)))):
                info = tarfile.TarInfo("%05d.%s.npy" % (shard * 1024 + i, name))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
PY

# 3 epochs of 64 steps (4096 samples, 4 ranks x 16), a read-ahead buffer of
# 16 KiB (the 2.4 MB of shards are 150 times that).
spec() {  # $1 = extra fields
  cat <<SPEC
name: "shards"
model { mlp { hidden_sizes: [32] } }
data { shards { format: TAR paths: "${TMP}/shards/train-*.tar" num_classes: 4
                read_ahead_bytes: 16384 shuffle_buffer: 256 } }
training { batch_size_per_rank: 16 epochs: 3 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 4 max_ranks: 4 }
elastic { max_restarts: 2 wait_seconds: 60 }
$1
SPEC
}

# --- undisturbed reference run
mkdir -p "${TMP}/ref_trace" "${TMP}/trace"
spec "" > "${TMP}/ref.textproto"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/ref_trace" timeout 100 "${CHORUS}" up --local 4 \
  --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json 2>"${TMP}/ref.err"); rc=$?
ref=$(check_sample_trace "${TMP}/ref_trace" 4 4096)
ref_crc=$(awk '$1 == "final" {print $6}' <<<"${ref}" | sort -u)
[[ ${rc} -eq 0 && "$(field "$(tail -n 1 <<<"${out}")" state)" == SUCCEEDED \
   && $(wc -l <<<"${ref_crc}") -eq 1 && "${ref_crc}" =~ ^[0-9a-f]{8}$ && "${ref}" != *error* \
   && "${ref}" == *"epochs 3 steps 192"* ]] \
  && pass "undisturbed run on shards: every sample once per epoch, 4 ranks end with ${ref_crc}" \
  || fail "reference rc=${rc} out='${out}' trace='${ref}' err=$(tail -3 "${TMP}/ref.err")"
loss=$(field "$(tail -n 1 <<<"${out}")" final_metrics.train_loss)
awk -v l="${loss}" 'BEGIN { exit !(l < 0.8) }' \
  && pass "it learns the teacher from the shards (loss ${loss}, chance ln 4 = 1.39)" \
  || fail "final loss '${loss}'"

# --- the same job, rank 1 killed with SIGKILL in epoch 1, one spare slot
spec "fault_injection { faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.04 } }" \
  > "${TMP}/elastic.textproto"
CHORUS_SAMPLE_TRACE="${TMP}/trace" timeout 110 "${CHORUS}" up --local 5 \
  --state_dir "${TMP}/elastic" "${TMP}/elastic.textproto" --json >"${TMP}/up.out" 2>"${TMP}/up.err" &
up_pid=$!
track_pid "${up_pid}"
wait_for '[[ -n "$(grep -l "^step 1 1 8[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60
victim=$(grep -l "^step 1 1 " "${TMP}"/trace/*.trace 2>/dev/null | head -n 1)
victim=$(basename "${victim:-none}" .trace)
if [[ "${victim}" =~ ^[0-9]+$ ]] && kill -KILL "${victim}"; then
  pass "killed rank 1 (pid ${victim}) at step $(grep -c '^step' "${TMP}/trace/${victim}.trace")"
else
  fail "no rank 1 to kill (victim '${victim}'); up: $(tail -3 "${TMP}/up.err")"
fi
wait_exit "${up_pid}" 100 || fail "chorus up still running 100 s after the kill"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/up.out")
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 192 ]] \
  && pass "the job succeeded after 192 steps" \
  || fail "elastic run rc=${rc} last='${last}' err=$(tail -5 "${TMP}/up.err")"
trace=$(check_sample_trace "${TMP}/trace" 4 4096)
[[ "${trace}" != *error* && "${trace}" == *"epochs 3 steps 192"* && "${trace}" == *"interrupted 1"* ]] \
  && pass "every sample of each of the 3 epochs, interrupted epoch 1 included, was trained exactly once" \
  || fail "sample trace: ${trace}"
finals=$(grep '^final' <<<"${trace}")
crcs=$(awk '{print $6}' <<<"${finals}" | sort -u)
[[ $(wc -l <<<"${finals}") -eq 4 && "${crcs}" == "${ref_crc}" ]] \
  && pass "all 4 ranks end with the undisturbed run's parameters (${crcs}): no sample lost or redone" \
  || fail "final lines: ${finals}; undisturbed ${ref_crc}"
assert_no_leftovers "a sharded elastic job"
finish
