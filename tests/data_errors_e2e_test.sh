#!/usr/bin/env bash
# End to end, sharded data as it comes (issue 59): a damaged shard fails the
# job with a reason that carries the rank's whole error (file, byte offset,
# sample, member), on one line, the same in `chorus up`'s result, `chorus
# status` and the status page's JSON; WebDataset's .cls labels train as the
# same labels in .npy members do, to the same loss.
#
# Usage (from Bazel): data_errors_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }

# make_shards DIR LABEL DAMAGE: one tar shard DIR/train-0.tar of 32 samples
# as WebDataset writes them, KEY.npy (float32 [16]) and the label k % 4 as
# KEY.y.npy (LABEL npy) or KEY.cls ("k\n", LABEL cls). DAMAGE: none;
# header (sample 3's .npy header lacks its shape); dtype (sample 5's input
# is float64); label (sample 6's .cls says "six"); checksum (a byte of
# sample 4's input header flipped); truncated (the file ends 50 bytes into
# sample 9's input); missing (sample 7 has no target member). The damaged
# member's data offset (its header's for checksum, truncated and missing)
# goes to DIR/offset, its .npy header up to its newline to DIR/header, the
# shard's size to DIR/size.
make_shards() {
  mkdir -p "$1"
  python3 - "$@" <<'PY' || fail "writing the shards in $1"
import io, random, struct, sys, tarfile
out, label, damage = sys.argv[1:4]
def npy(descr, shape, data, key="shape"):
    dims = ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, '%s': (%s), }" % (descr, key, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data
rng = random.Random(5)
with tarfile.open(out + "/train-0.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
    for k in range(32):
        x = [rng.gauss(0, 1) for _ in range(16)]
        members = [("npy", npy("<f8", (16,), struct.pack("<16d", *x)) if damage == "dtype" and k == 5
                    else npy("<f4", (16,), struct.pack("<16f", *x),
                             "shapf" if damage == "header" and k == 3 else "shape"))]
        if label == "npy":
            members.append(("y.npy", npy("<i8", (), struct.pack("<q", k % 4))))
        else:
            members.append(("cls", b"six\n" if damage == "label" and k == 6 else b"%d\n" % (k % 4)))
        if damage == "missing" and k == 7:
            members.pop()
        for suffix, data in members:
            if (damage, k, suffix) in (("header", 3, "npy"), ("dtype", 5, "npy"), ("label", 6, "cls")):
                open(out + "/offset", "w").write(str(tar.offset + 512))
                open(out + "/header", "w").write(data[10:data.index(b"\n")].decode())
            if (damage, k, suffix) in (("checksum", 4, "npy"), ("truncated", 9, "npy"),
                                       ("missing", 7, "npy")):
                open(out + "/offset", "w").write(str(tar.offset))
                open(out + "/member_size", "w").write(str(len(data)))
            info = tarfile.TarInfo("%05d.%s" % (k, suffix))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
if damage in ("checksum", "truncated"):
    at = int(open(out + "/offset").read())
    raw = bytearray(open(out + "/train-0.tar", "rb").read())
    if damage == "checksum":
        raw[at + 20] ^= 0x01  # inside the member's name field
    else:
        raw = raw[:at + 512 + 50]
    open(out + "/train-0.tar", "wb").write(bytes(raw))
import os
open(out + "/size", "w").write(str(os.path.getsize(out + "/train-0.tar")))
PY
}

spec() {  # $1 = dir, $2 = target_member
  cat <<SPEC
name: "data-errors"
model { mlp { hidden_sizes: [8] } }
data { shards { format: TAR paths: "$1/train-*.tar" input_member: "npy" target_member: "$2"
                num_classes: 4 } }
training { batch_size_per_rank: 8 epochs: 2 shuffle: false log_every_steps: 1 }
optimizer { kind: SGD lr: 0.1 }
SPEC
}

# run_job NAME DIR TARGET: `chorus up --local 1` of spec DIR TARGET, state
# in TMP/NAME; sets RC, LAST (its JSON line) and REASON.
run_job() {
  spec "$2" "$3" >"${TMP}/$1.textproto"
  local out
  out=$(timeout 120 "${CHORUS}" up --local 1 --state_dir "${TMP}/$1" "${TMP}/$1.textproto" --json \
          2>"${TMP}/$1.err")
  RC=$?
  LAST=$(echo "${out}" | tail -n 1)
  REASON=$(field "${LAST}" reason)
}

# expect_reason NAME WHAT: the failed job's reason is the rank's error
# record, one line holding WHAT.
expect_reason() {
  [[ ${RC} -eq 1 && "$(field "${LAST}" state)" == FAILED \
     && "${REASON}" == "rank 0 ("*") exited with code 1; last stderr: chorus-rank: $2" \
     && "${REASON}" != *$'\n'* ]] \
    && pass "$1: the reason names file, offset and sample: ${REASON}" \
    || fail "$1 rc=${RC} reason='${REASON}' err=$(tail -3 "${TMP}/$1.err")"
}

# --- a .npy member whose header lacks its shape: the header (which ends in
# a newline) is quoted on the reason's one line, after file, offset, sample
# and member
make_shards "${TMP}/header" npy header
run_job header "${TMP}/header" y.npy
expect_reason "damaged .npy header" \
  "data.shards: ${TMP}/header/train-0.tar at byte offset $(cat "${TMP}/header/offset") (sample 3, member \"00003.npy\"): .npy header \"$(cat "${TMP}/header/header")\\n\" lacks descr, fortran_order or shape"

# The same reason in `chorus status` and on the status page (its JSON).
if start_coordinator -s "${TMP}/header/state" -- --http_port_file "${TMP}/http.port"; then
  out=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status job-000001 2>&1)
  [[ "${out}" == *"  reason: ${REASON}"$'\n'* ]] && pass "chorus status shows the same reason" \
    || fail "status: ${out}"
  page=$(python3 - "http://127.0.0.1:$(cat "${TMP}/http.port")/api/jobs/job-000001" <<'PY'
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    print(json.loads(r.read().decode())["status"]["job"]["reason"])
PY
  )
  [[ "${page}" == "${REASON}" ]] && pass "the page's JSON has the same reason" \
    || fail "page reason '${page}'"
  # /metrics: the failed job's series carries the same reason as a label
  # (unescaped here as Prometheus reads the exposition).
  label=$(python3 - "http://127.0.0.1:$(cat "${TMP}/http.port")/metrics" <<'PY'
import re, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    text = r.read().decode()
for line in text.splitlines():
    if line.startswith('chorus_job_failed_timestamp_seconds{job="job-000001",'):
        m = re.search(r'reason="((?:[^"\\]|\\.)*)"', line)
        print(re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(1)))
PY
  )
  [[ -n "${label}" && "${label}" == "${REASON}" ]] && pass "/metrics carries the same reason as a label" \
    || fail "/metrics reason label '${label}'"
  kill "${COORDINATOR_PID}"
  wait "${COORDINATOR_PID}" 2>/dev/null
else
  fail "no coordinator started on ${TMP}/header/state"
fi

# --- a member of another dtype: both types and shapes, and which differs
make_shards "${TMP}/dtype" npy dtype
run_job dtype "${TMP}/dtype" y.npy
expect_reason "float64 member" \
  "data.shards: ${TMP}/dtype/train-0.tar at byte offset $(cat "${TMP}/dtype/offset") (sample 5, member \"00005.npy\"): this member holds float64 of shape (16), the first sample's float32 of shape (16): its type differs; every sample's member must have the same"

# --- a .cls label that is not an integer
make_shards "${TMP}/label" cls label
run_job label "${TMP}/label" cls
expect_reason "non-integer .cls label" \
  "data.shards: ${TMP}/label/train-0.tar at byte offset $(cat "${TMP}/label/offset") (sample 6, member \"00006.cls\"): holds \"six\\n\", not one integer: a .cls, .txt or .json target member must hold an integer class label as text (as WebDataset writes one)"

# --- a damaged tar header, a truncated shard and a sample without its
# target member: found when the rank indexes the shard; the reason names
# the header's offset and the shard's sample it would begin or belong to
make_shards "${TMP}/checksum" npy checksum
run_job checksum "${TMP}/checksum" y.npy
expect_reason "damaged tar header" \
  "data.shards: ${TMP}/checksum/train-0.tar at byte offset $(cat "${TMP}/checksum/offset") (sample 4 of this shard): not a tar header (bad checksum); the shard is damaged or not a tar file"

make_shards "${TMP}/truncated" npy truncated
run_job truncated "${TMP}/truncated" y.npy
expect_reason "truncated shard" \
  "data.shards: ${TMP}/truncated/train-0.tar at byte offset $(cat "${TMP}/truncated/offset") (sample 9 of this shard): member \"00009.npy\" of $(cat "${TMP}/truncated/member_size") bytes runs past the end of the file ($(cat "${TMP}/truncated/size") bytes): the shard is truncated"

make_shards "${TMP}/missing" npy missing
run_job missing "${TMP}/missing" y.npy
expect_reason "sample without its target" \
  "data.shards: ${TMP}/missing/train-0.tar at byte offset $(cat "${TMP}/missing/offset") (sample 7 of this shard): sample \"00007\" has no y.npy member (a sample's members must be consecutive)"

# --- a damaged index file: sample 2's record points past the shard's end
make_shards "${TMP}/index" npy none
python3 - "${TMP}/index/train-0.tar" <<'PY' || fail "writing the index file"
import os, struct, sys
shard = sys.argv[1]
st = os.stat(shard)
records = [(1024 * (2 * k) + 512, 1024 * (2 * k + 1) + 512, 192, 136) for k in range(32)]
records[2] = (st.st_size + 4096, records[2][1], 192, 136)
with open(shard + ".idx", "wb") as f:
    f.write(b"CHORUSI1" + struct.pack("<qqqII", st.st_size, int(st.st_mtime), 32, 3, 5) + b"npyy.npy")
    for r in records:
        f.write(struct.pack("<qqii", *r))
PY
run_job index "${TMP}/index" y.npy
expect_reason "damaged index file" \
  "data.shards: the index file ${TMP}/index/train-0.tar.idx is damaged (sample 2's record at byte offset 96 lies outside the shard's $(cat "${TMP}/index/size") bytes): delete it (the shard is then scanned) or write it again with \`chorus dataset pack\`"

# --- a token past the vocabulary: the token's own offset (token 58 of the
# file, the third of sample 7), not its sample's (112)
mkdir -p "${TMP}/tokens"
python3 - "${TMP}/tokens/train.bin" <<'PY' || fail "writing the token file"
import struct, sys
tokens = [(i * 7) % 200 for i in range(8 * 20 + 1)]
tokens[58] = 300
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(tokens), *tokens))
PY
cat >"${TMP}/tokens.textproto" <<SPEC
model { transformer_lm { vocab_size: 256 context_length: 8 d_model: 16 num_heads: 2 num_layers: 1 } }
data { shards { format: TOKENS paths: "${TMP}/tokens/train.bin" sequence_length: 8 } }
training { batch_size_per_rank: 4 epochs: 1 shuffle: false }
SPEC
out=$(timeout 120 "${CHORUS}" up --local 1 --state_dir "${TMP}/tokens-run" "${TMP}/tokens.textproto" \
        --json 2>"${TMP}/tokens.err"); RC=$?
LAST=$(echo "${out}" | tail -n 1)
REASON=$(field "${LAST}" reason)
expect_reason "token past the vocabulary" \
  "data.shards: ${TMP}/tokens/train.bin at byte offset 116 (sample 7): token id 300 is not in [0, model.transformer_lm.vocab_size 256)"

# --- WebDataset's .cls labels train as the same labels in .npy members
make_shards "${TMP}/npy" npy none
make_shards "${TMP}/cls" cls none
run_job npy "${TMP}/npy" y.npy
npy_loss=$(field "${LAST}" final_metrics.train_loss)
npy_rc=${RC}
run_job cls "${TMP}/cls" cls
cls_loss=$(field "${LAST}" final_metrics.train_loss)
[[ ${npy_rc} -eq 0 && ${RC} -eq 0 && -n "${npy_loss}" && "${cls_loss}" == "${npy_loss}" ]] \
  && pass ".cls labels train to the loss of .npy labels (${cls_loss})" \
  || fail ".cls rc=${RC} loss '${cls_loss}', .npy rc=${npy_rc} loss '${npy_loss}' err=$(tail -3 "${TMP}/cls.err")"

assert_no_leftovers "jobs on damaged shards"
finish
