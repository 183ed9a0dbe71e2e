// Fuzz target: checkpoint manifests as the coordinator reads them back — a
// step directory's MANIFEST file, a row of the state database — through the
// CheckpointStore that resumes and exports use (coordinator/checkpoint/checkpoint_store.h).
//
// Input: the bytes of a MANIFEST file (a serialized chorus.v1.CheckpointManifest).
//
// A store in a scratch directory holds one real committed checkpoint
// (job-sentinel step 1, one file), made once per process; checking it
// also checks that its MANIFEST file reads back as the manifest the state
// database holds. For each input that parses as a manifest:
//   - saving it in the state database and loading it back gives it back;
//   - FindLoadable on its job (newest, and its step) finds it only when its
//     files are present as recorded, and otherwise says why it skipped it;
//   - Recover() with it recorded keeps the sentinel checkpoint, which stays
//     loadable; the input's row is deleted afterwards.
// Manifests whose directory lies outside the scratch directory are recorded
// and loaded back but not resolved against the disk: checking them would
// read whatever file of this machine they name.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/state/state_store.h"
#include "fuzz/scratch_dir.h"
#include "glog/logging.h"
#include "google/protobuf/util/message_differencer.h"

namespace chorus {
namespace {

constexpr char kSentinelJob[] = "job-sentinel";

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_manifest_fuzzer: %s\n", what.c_str());
  std::abort();
}

struct Store {
  std::string dir;
  std::unique_ptr<StateStore> state;
  std::unique_ptr<CheckpointStore> store;
  v1::CheckpointManifest sentinel;
};

void CheckSentinel(Store& s) {
  std::vector<std::string> skipped;
  absl::StatusOr<v1::CheckpointManifest> m = s.store->FindLoadable(kSentinelJob, 1, &skipped);
  if (!m.ok()) Fail("the sentinel checkpoint is gone: " + m.status().ToString());
  if (!google::protobuf::util::MessageDifferencer::Equals(*m, s.sentinel)) {
    Fail("the sentinel's manifest changed");
  }
}

Store& TheStore() {
  static Store* const s = [] {
    auto* s = new Store;
    // Fatal messages only: the store logs every commit and refusal.
    FLAGS_minloglevel = google::GLOG_FATAL;
    s->dir = ScratchDir() + "/manifests";
    absl::StatusOr<std::unique_ptr<StateStore>> state = StateStore::Open(s->dir);
    if (!state.ok()) Fail(state.status().ToString());
    s->state = *std::move(state);
    s->store = std::make_unique<CheckpointStore>(s->dir + "/checkpoints", *s->state);
    if (absl::Status st = s->store->Recover(); !st.ok()) Fail(st.ToString());
    auto upload = s->store->BeginUpload(kSentinelJob, 1);
    if (!upload.ok()) Fail(upload.status().ToString());
    const std::string data = "sentinel bytes";
    v1::CheckpointChunk chunk;
    chunk.set_file_name("model.pt");
    chunk.set_data(data);
    chunk.set_chunk_crc32c(Crc32c(data));
    chunk.set_last(true);
    chunk.set_file_size(static_cast<int64_t>(data.size()));
    chunk.set_file_crc32c(Crc32c(data));
    if (absl::Status st = (*upload)->AddChunk(chunk); !st.ok()) Fail(st.ToString());
    v1::CheckpointManifest info;
    info.set_world_size(1);
    info.set_generation(1);
    auto committed = (*upload)->Commit(info, /*keep_last=*/0);
    if (!committed.ok()) Fail(committed.status().ToString());
    s->sentinel = *committed;
    std::ifstream in(s->store->FilePath(s->sentinel, "MANIFEST"), std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    v1::CheckpointManifest from_file;
    if (!from_file.ParseFromString(bytes) ||
        !google::protobuf::util::MessageDifferencer::Equals(from_file, s->sentinel)) {
      Fail("the MANIFEST file does not hold the committed manifest");
    }
    CheckSentinel(*s);
    return s;
  }();
  return *s;
}

void CheckManifest(const std::string& bytes) {
  Store& s = TheStore();
  v1::CheckpointManifest m;
  if (!m.ParseFromString(bytes)) return;
  // The sentinel's row is not the input's to replace.
  if (m.job_id() == kSentinelJob) m.set_job_id("job-input");

  if (absl::Status st = s.state->SaveManifest(m); !st.ok()) {
    Fail("a parsed manifest cannot be recorded: " + st.ToString());
  }
  absl::StatusOr<std::vector<v1::CheckpointManifest>> all = s.state->LoadManifests(m.job_id());
  if (!all.ok()) Fail("manifests cannot be loaded back: " + all.status().ToString());
  // An empty job id loads every job's manifests (the sentinel's among them).
  bool found = false;
  for (const v1::CheckpointManifest& back : *all) {
    if (back.job_id() == m.job_id() && back.step() == m.step()) {
      found = found || google::protobuf::util::MessageDifferencer::Equals(back, m);
    }
  }
  if (!found) Fail("the recorded manifest came back changed or not at all");

  const bool on_scratch = m.directory().empty() || (absl::StartsWith(m.directory(), s.dir + "/") &&
                                                    !absl::StrContains(m.directory(), ".."));
  bool names_stay = true;
  for (const v1::CheckpointFile& f : m.files()) {
    names_stay =
        names_stay && !absl::StrContains(f.name(), "..") && !f.name().empty() && f.name()[0] != '/';
  }
  if (on_scratch && names_stay && !m.job_id().empty() && !absl::StrContains(m.job_id(), "..") &&
      !absl::StrContains(m.job_id(), "/")) {
    for (int64_t step : {int64_t{0}, m.step()}) {
      std::vector<std::string> skipped;
      absl::StatusOr<v1::CheckpointManifest> loadable =
          s.store->FindLoadable(m.job_id(), step, &skipped);
      // Only the sentinel's files exist under the store's root.
      if (loadable.ok() && m.directory().empty() && m.files_size() > 0 &&
          google::protobuf::util::MessageDifferencer::Equals(*loadable, m)) {
        Fail("a manifest whose files are not there was found loadable");
      }
      if (!loadable.ok() && loadable.status().code() != absl::StatusCode::kNotFound) {
        Fail("FindLoadable failed with other than NOT_FOUND: " + loadable.status().ToString());
      }
    }
  }
  if (absl::Status st = s.store->Recover(); !st.ok()) Fail("Recover failed: " + st.ToString());
  if (absl::Status st = s.state->DeleteManifest(m.job_id(), m.step()); !st.ok()) {
    Fail("the recorded manifest cannot be deleted: " + st.ToString());
  }
  CheckSentinel(s);
}

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::CheckManifest(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
