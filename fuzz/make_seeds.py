#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets under fuzz/corpus/ (docs/fuzzing.md).

Usage: python3 fuzz/make_seeds.py     (from the repository root; needs protoc and PyTorch)

Each seed is a small valid (or nearly valid) input in the target's input
format, so that the fuzzers start from the shapes the code expects: job specs
from examples/, a recorded checkpoint data-port session, MANIFEST files, IDX
files, torch.save files, serialized request and heartbeat protos. The files are committed; run
this again only when an input format changes.
"""
import gzip
import os
import shutil
import struct
import subprocess
import zipfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def encode(message, text):
    """The binary form of `text` (text format) as chorus.v1.`message`."""
    return subprocess.run(
        ["protoc", "-I", os.path.join(ROOT, "proto"), "--encode=chorus.v1." + message,
         "chorus/v1/coordinator.proto"],
        input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def u16(n):
    return struct.pack("<H", n)


# ------------------------------------------------------------- job specs
def job_specs():
    formats = {".textproto": 0, ".json": 1, ".yaml": 2}
    examples = os.path.join(ROOT, "examples")
    for name in sorted(os.listdir(examples)):
        ext = os.path.splitext(name)[1]
        if ext in formats:
            with open(os.path.join(examples, name), "rb") as f:
                write("job_spec_fuzzer", name, bytes([formats[ext]]) + f.read())
    write("job_spec_fuzzer", "custom_topology.textproto", b"\x00" + b"""
model { mlp { hidden_sizes: [8] } }
data { synthetic { num_samples: 64 input_shape: [4] } }
strategy { decentralized { topology: CUSTOM
  custom_steps { groups { ranks: [0, 1] } groups { ranks: [2, 3] } }
  custom_steps { groups { ranks: [0, 2] } groups { ranks: [1, 3] } } } }
resources { min_ranks: 4 max_ranks: 4 }
""")
    write("job_spec_fuzzer", "elastic_ring.yaml", b"\x02" + b"""
name: ring-job
model: {cnn: {channels: [4, 8], kernel_size: 3}}
data: {fashion_mnist: {train_limit: 100}}
strategy: {decentralized: {topology: ALTERNATING_EXPONENTIAL_RING, local_world_size: 2}}
resources: {min_ranks: 2, max_ranks: 8}
lr_schedule: {cosine: {warmup_steps: 10, total_steps: 100}}
fault_injection: {faults: [{kind: EXIT, rank: 1, at_step: 5, exit_code: 3}]}
""")
    write("job_spec_fuzzer", "bad_values.json", b"\x01" + b"""
{"model": {"transformer_lm": {"d_model": 10, "num_heads": 3}},
 "data": {"synthetic": {"kind": "TOKENS"}},
 "optimizer": {"kind": "ADAMW", "lr": -1, "momentum": 0.5},
 "checkpoint": {"storage": "SHARED_DIR", "shared_dir": "relative"}}
""")
    write("job_spec_fuzzer", "program.yaml", b"\x02" + b"""
name: byo-loop
program:
  argv: [/usr/bin/python3, train.py, --epochs, "1"]
  env: {SEED: "7", RANK: "9"}
  working_dir: /srv/proj
resources: {min_ranks: 2}
hang_detection: {dead_after_seconds: 3}
""")
    write("job_spec_fuzzer", "program_with_model.textproto", b"\x00" + b"""
program { argv: "bin/train" env { key: "A" value: "1" } }
model { mlp {} }
optimizer { lr: 0.1 }
""")


# --------------------------------------------------- checkpoint data port
def chunk_header(data_len, crc, offset, file_size, file_crc, name_len, flags):
    return struct.pack("<IIQQIHBB", data_len, crc, offset, file_size, file_crc, name_len, flags, 0)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def file_chunks(name, data, pieces):
    out = b""
    offset = 0
    step = max(1, len(data) // pieces)
    parts = [data[i:i + step] for i in range(0, len(data), step)] or [b""]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        n = name if i == 0 else b""
        out += chunk_header(len(part), crc32c(part), offset, len(data) if last else 0,
                            crc32c(data) if last else 0, len(n), 1 if last else 0) + n + part
        offset += len(part)
    return out


END = chunk_header(0, 0, 0, 0, 0, 0, 2)


def data_port():
    t = "checkpoint_data_fuzzer"
    model = b"model weights " * 8
    state = b"optimizer state"
    # Flags byte 1: the harness sends the hello with the upload's token.
    write(t, "one_file", b"\x01" + file_chunks(b"model.pt", model, 1) + END)
    write(t, "two_files_chunked", b"\x01" + file_chunks(b"model.pt", model, 3) +
          file_chunks(b"train_state.pt", state, 2) + END)
    write(t, "empty_file", b"\x01" + file_chunks(b"model.pt", b"", 1) + END)
    bad = bytearray(file_chunks(b"model.pt", model, 1) + END)
    bad[4] ^= 0xFF  # the chunk's CRC-32C
    write(t, "bad_chunk_crc", b"\x01" + bytes(bad))
    write(t, "no_files", b"\x01" + END)
    write(t, "unfinished_file", b"\x01" + file_chunks(b"model.pt", model, 2)[:-20])
    write(t, "bad_name", b"\x01" + file_chunks(b"../escape.pt", model, 1) + END)
    # Flags byte 0: the input is the whole connection.
    write(t, "http_probe", b"\x00GET / HTTP/1.0\r\n\r\n")
    write(t, "unknown_token", b"\x00CHORUSD1" + b"\x00" * 32 + file_chunks(b"model.pt", model, 1) +
          END)


# ---------------------------------------------------------- manifests
def manifests():
    t = "checkpoint_manifest_fuzzer"
    write(t, "coordinator_manifest", encode("CheckpointManifest", """
job_id: "job-000007" step: 500 world_size: 2 strategy: "ddp" spec_hash: "abc" generation: 1
commit_time_us: 1700000000000000
files { name: "model.pt" size: 1234 crc32c: 305419896 }
files { name: "train_state.pt" size: 99 crc32c: 1 }
"""))
    write(t, "old_sha256_manifest", encode("CheckpointManifest", """
job_id: "job-000002" step: 10 world_size: 1 strategy: "ddp"
files { name: "model.pt" size: 3
        sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" }
"""))
    write(t, "shared_dir_manifest", encode("CheckpointManifest", """
job_id: "job-000003" step: 20 world_size: 4 strategy: "decentralized" per_rank: true
directory: "/shared/ckpt/job-000003/000000000020"
files { name: "model.pt" size: 10 crc32c: 7 }
files { name: "model.rank1.pt" size: 10 crc32c: 8 }
"""))
    write(t, "empty_manifest", b"")


# ------------------------------------------------------------ heartbeats
def heartbeats():
    t = "heartbeat_fuzzer"

    def record(flags, tenths, text):
        body = encode("RankHeartbeat", text)
        return bytes([flags, tenths]) + u16(len(body)) + body

    def hb(rank, step, phase, records="", compute=0.1, last_enqueued=0):
        return ("rank: %d step: %d phase: %s phase_seconds: 1.5 time_us: 1000000 "
                "timings { step_seconds: 0.2 compute_seconds: %f comm_wait_seconds: 0.05 } "
                "flight_recorder { last_enqueued_seq: %d %s }" %
                (rank, step, phase, compute, last_enqueued, records))

    started = ('records { seq: 7 state: STARTED started_us: 1000000 '
               'fingerprint { op: "allreduce" tag: "ddp:model/bucket0" dtype: "float32" '
               'count: 1024 bytes: 4096 } }')
    completed = ('records { seq: 6 state: COMPLETED started_us: 900000 completed_us: 950000 '
                 'fingerprint { op: "allreduce" tag: "ddp:model/bucket0" dtype: "float32" '
                 'count: 1024 } }')
    other = ('records { seq: 7 state: STARTED started_us: 1000000 '
             'fingerprint { op: "broadcast" tag: "ddp:buffers" dtype: "float32" count: 8 } }')
    # Header byte: world 2, action REPORT (0x01) / ABORT (0x05).
    write(t, "steady_two_ranks", b"\x01" + record(0, 10, hb(0, 5, "FORWARD", completed)) +
          record(0, 0, hb(1, 5, "FORWARD", completed)) + record(0, 10, hb(0, 6, "FORWARD")))
    write(t, "never_joined", b"\x05" + record(0, 10, hb(0, 7, "FORWARD", started + completed, 0.1, 7)) +
          record(0, 0, hb(1, 6, "EVAL", completed, 0.1, 6)) +
          record(0, 50, hb(1, 6, "FORWARD", completed, 0.1, 6)))
    write(t, "mismatch", b"\x01" + record(0, 10, hb(0, 7, "FORWARD", started, 0.1, 7)) +
          record(0, 0, hb(1, 7, "FORWARD", other, 0.1, 7)))
    write(t, "straggler_four_ranks", b"\x03" + b"".join(
        record(0, 5, hb(r, 9, "FORWARD", "", 0.1 if r else 0.9)) for r in range(4)))
    write(t, "dead_rank", b"\x01" + record(0, 10, hb(0, 1, "FORWARD")) + record(0, 100, hb(0, 2, "FORWARD")))
    write(t, "stale_generation", b"\x01" + record(2, 1, "generation: 3 rank: 0 step: 1") +
          record(1, 1, 'job_id: "job-999999" rank: 1'))


# ------------------------------------------------------------------ IDX
def idx(shape, data, kind=0x08):
    return struct.pack(">BBBB", 0, 0, kind, len(shape)) + b"".join(
        struct.pack(">I", d) for d in shape) + bytes(data)


def idx_files():
    t = "idx_fuzzer"
    images = idx([2, 4, 4], range(32))
    labels = idx([2], [3, 9])
    write(t, "images_3d", b"\x00" + images)
    write(t, "labels_1d", b"\x00" + labels)
    write(t, "images_gzip", b"\x00" + gzip.compress(images, mtime=0))
    write(t, "truncated", b"\x00" + images[:-5])
    write(t, "not_uint8", b"\x00" + idx([2], [0] * 8, kind=0x0D))
    # Fashion-MNIST pair: u32 images length, images, train_limit, labels.
    write(t, "fashion_pair", b"\x01" + struct.pack("<I", len(images)) + images + b"\x00" + labels)
    write(t, "fashion_pair_gzip", b"\x01" + struct.pack("<I", len(gzip.compress(images, mtime=0))) +
          gzip.compress(images, mtime=0) + b"\x01" + gzip.compress(labels, mtime=0))


# ----------------------------------------------------------- store service
def store_requests():
    t = "store_service_fuzzer"

    def record(op, message, text):
        body = encode(message, text)
        return bytes([op]) + u16(len(body)) + body

    set_a = record(0, "StoreSetRequest", 'ns: "job-1/gen-1" key: "rank0" value: "127.0.0.1:4000"')
    set_b = record(0, "StoreSetRequest", 'ns: "job-1/gen-1" key: "rank1" value: "127.0.0.1:4001"')
    wait = record(2, "StoreWaitRequest", 'ns: "job-1/gen-1" keys: ["rank0", "rank1"] wait_seconds: 30')
    get_wait = record(1, "StoreGetRequest", 'ns: "job-1/gen-1" key: "rank1" wait_seconds: 30')
    get_now = record(1, "StoreGetRequest", 'ns: "job-1/gen-1" key: "rank0"')
    add = record(3, "StoreAddRequest", 'ns: "job-1/gen-1" key: "counter" delta: 5')
    add_big = record(3, "StoreAddRequest", 'ns: "job-1/gen-1" key: "counter" delta: 9223372036854775800')
    write(t, "rendezvous", wait + get_wait + set_a + get_now + set_b)
    write(t, "counter", add + add + record(3, "StoreAddRequest",
                                           'ns: "job-1/gen-1" key: "counter" delta: -3'))
    write(t, "counter_overflow", add + add_big + add)
    write(t, "add_on_text", set_a + record(3, "StoreAddRequest",
                                           'ns: "job-1/gen-1" key: "rank0" delta: 1'))
    write(t, "bad_requests", record(0, "StoreSetRequest", 'key: "k" value: "v"') +
          record(1, "StoreGetRequest", 'ns: "n" key: "k" wait_seconds: -1') +
          record(2, "StoreWaitRequest", 'ns: "" keys: ["a"]') +
          record(1, "StoreGetRequest", 'ns: "n" key: "missing"'))


# ------------------------------------------------------------ tensor files
def tensor_files():
    t = "tensor_file_fuzzer"
    testdata = os.path.join(ROOT, "worker", "train", "testdata")
    for name in ("tiny_data.pt", "tiny_eval.pt", "bad_keys.pt"):
        d = os.path.join(CORPUS, t)
        os.makedirs(d, exist_ok=True)
        shutil.copyfile(os.path.join(testdata, name), os.path.join(d, name))
    write(t, "not_a_zip", b"PK\x03\x04 not really a zip")


# ------------------------------------------------------ torch.save shards
def torch_save_files():
    """TENSOR_FILES shards as torch.save writes them (needs PyTorch)."""
    import collections
    import io
    import torch

    t = "torch_save_fuzzer"

    def save(name, obj, **kwargs):
        """The file as it is (b"\\x00" + bytes), and zip files also as their
        members (b"\\x01" + u8 name length, name, u16 length, data, ...)."""
        buf = io.BytesIO()  # a buffer, not a path: the archive is "archive/" whatever the name
        torch.save(obj, buf, **kwargs)
        write(t, name, b"\x00" + buf.getvalue())
        if zipfile.is_zipfile(buf):
            members = b""
            with zipfile.ZipFile(buf) as z:
                for info in z.infolist():
                    data = z.read(info)
                    members += (bytes([len(info.filename)]) + info.filename.encode() +
                                u16(len(data)) + data)
            write(t, name + ".members", b"\x01" + members)

    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    y = torch.arange(4)
    save("float_rows.pt", {"x": x, "y": y})
    save("uint8_images.pt", {"x": torch.arange(8, dtype=torch.uint8).reshape(2, 1, 2, 2),
                             "y": torch.tensor([1, 0], dtype=torch.int16)})
    save("double_and_int32.pt", {"x": x.double(), "y": y.int()})
    save("parameter.pt", {"x": torch.nn.Parameter(x), "y": y.float().requires_grad_()})
    base = torch.arange(20, dtype=torch.int64)  # one storage under both, at offsets
    save("shared_storage.pt", {"x": base[4:16].view(4, 3), "y": base[:4]})
    save("transposed.pt", {"x": x.t(), "y": torch.arange(3)})
    save("ordered_dict.pt", collections.OrderedDict([("y", y), ("x", x)]))
    save("with_extras.pt", {"x": x, "y": y, "meta": {"rows": 4}, "name": "shard-0",
                            "sizes": [4, 3], "half": torch.zeros(2, dtype=torch.float16)})
    save("no_y.pt", {"x": x})
    save("a_list.pt", [x, y])
    # Its storage keys are object ids: rewritten, it differs (and is refused alike).
    save("legacy_format.pt", {"x": x, "y": y}, _use_new_zipfile_serialization=False)
    write(t, "long_ints.members", b"\x01" + long_int_members())


def long_int_members():
    """{'x': float32 [4, 3], 'y': int64 [4]} pickled by hand with every int
    an 8-byte LONG1 (torch.save writes small ints in 1 byte), so that a
    mutation reaches the sizes, offsets and counts near 2^63 as easily as
    small ones. In the members form of torch_save_fuzzer."""
    def string(v):
        return b"X" + struct.pack("<I", len(v)) + v.encode()

    def long1(v):
        return b"\x8a\x08" + struct.pack("<q", v)

    def ints(vs):
        return b"(" + b"".join(long1(v) for v in vs) + b"t"

    def tensor(key, cls, numel, sizes, strides):
        return (b"ctorch._utils\n_rebuild_tensor_v2\n((" + string("storage") + b"ctorch\n" +
                cls + b"\n" + string(key) + string("cpu") + long1(numel) + b"tQ" + long1(0) +
                ints(sizes) + ints(strides) + b"\x89ccollections\nOrderedDict\n)RtR")

    pickle = (b"\x80\x02}(" + string("x") + tensor("0", b"FloatStorage", 12, [4, 3], [3, 1]) +
              string("y") + tensor("1", b"LongStorage", 4, [4], [1]) + b"u.")
    members = [("archive/data.pkl", pickle), ("archive/data/0", struct.pack("<12f", *range(12))),
               ("archive/data/1", struct.pack("<4q", *range(4))), ("archive/byteorder", b"little")]
    return b"".join(bytes([len(n)]) + n.encode() + u16(len(d)) + d for n, d in members)


if __name__ == "__main__":
    job_specs()
    data_port()
    manifests()
    heartbeats()
    idx_files()
    store_requests()
    tensor_files()
    torch_save_files()
