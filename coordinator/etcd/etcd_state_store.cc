#include "coordinator/etcd/etcd_state_store.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/paths.h"
#include "common/private_files.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

// Largest number of ops in one read transaction (etcd's --max-txn-ops is
// 128 by default).
constexpr int kReadsPerTxn = 100;

std::string Pad(int64_t n) { return absl::StrFormat("%020d", std::max<int64_t>(n, 0)); }

absl::Status CheckNumber(const char* what, const std::string& job_id, int64_t n) {
  if (n >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("etcd state: ", what, " of ", job_id, " must be >= 0, got ", n));
}

etcdserverpb::RequestOp Put(std::string key, std::string value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(std::move(key));
  op.mutable_request_put()->set_value(std::move(value));
  return op;
}

// The number after the last '/' of `key`.
int64_t TrailingNumber(const std::string& key) {
  int64_t n = 0;
  (void)absl::SimpleAtoi(key.substr(key.rfind('/') + 1), &n);
  return n;
}

}  // namespace

EtcdStateStore::EtcdStateStore(EtcdClient& etcd, std::string prefix, LeaderFence fence,
                               EtcdStateStoreOptions options)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      fence_(std::move(fence)),
      options_(options),
      path_(absl::StrCat(etcd.name(), " under ", prefix_)) {}

absl::StatusOr<std::unique_ptr<EtcdStateStore>> EtcdStateStore::Open(EtcdClient& etcd,
                                                                     std::string prefix,
                                                                     LeaderFence fence,
                                                                     EtcdStateStoreOptions options) {
  if (fence.create_revision <= 0 || fence.key.empty()) {
    return absl::FailedPreconditionError(
        "etcd state: opened without a leadership (campaign before opening the state)");
  }
  std::unique_ptr<EtcdStateStore> store(
      new EtcdStateStore(etcd, std::move(prefix), std::move(fence), options));
  ASSIGN_OR_RETURN(store->cluster_id_, store->LoadOrCreateClusterId());
  return store;
}

absl::StatusOr<std::string> EtcdStateStore::LoadOrCreateClusterId() {
  const std::string key = prefix_ + "/cluster_id";
  ASSIGN_OR_RETURN(std::optional<std::string> id, Get(key));
  if (id.has_value()) return *std::move(id);
  const std::string fresh = NewClusterId();
  RETURN_IF_ERROR(Write("saving the cluster id", {Put(key, fresh)}));
  return fresh;
}

// Note [Fenced writes]
// Every write is
//   if create_revision(PREFIX/leader) == fence.create_revision
//   then <the write's ops> else range PREFIX/leader
// so it is applied only while the key this coordinator created still
// exists. etcd applies transactions in one serial order, so no write of a
// deposed leader can land after a successor has won, whatever the deposed
// leader's clock believes. The else branch reads the key to say who leads.
//
// Note [etcd limits]
// One write is at most 3 puts (SaveJobAndEvent) plus the compare, far below
// etcd's 128 ops per transaction. A request larger than etcd's
// --max-request-bytes (1.5 MiB by default) is refused by etcd; the write then
// fails with RESOURCE_EXHAUSTED naming the record and its size, nothing is
// stored, and the RPC that caused it fails (a job spec that large is refused at
// submission; raise --max-request-bytes on every member to allow it). Reads go
// a page at a time, so no response is near the limit.
absl::Status EtcdStateStore::Write(const std::string& what,
                                   std::vector<etcdserverpb::RequestOp> ops) {
  // A coordinator stops leading (IsLeader false) a little before etcd ends
  // its lease and deletes the key (Note [Leader lease]): in between, the
  // fence below would still pass. That is when a coordinator that lost its
  // lease shuts its services down, and their streams ending must not be
  // written as the cluster's news (agents "lost", jobs re-formed): the next
  // leader finds the agents connected and the jobs as they were.
  if (options_.still_leading && !options_.still_leading()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this coordinator no longer leads (its lease ended or was given up): ", what,
        " refused (", etcd_.name(), ")"));
  }
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* fence = txn.add_compare();
  fence->set_key(fence_.key);
  fence->set_target(etcdserverpb::Compare::CREATE);
  fence->set_result(etcdserverpb::Compare::EQUAL);
  fence->set_create_revision(fence_.create_revision);
  for (etcdserverpb::RequestOp& op : ops) *txn.add_success() = std::move(op);
  txn.add_failure()->mutable_request_range()->set_key(fence_.key);
  absl::StatusOr<etcdserverpb::TxnResponse> result = etcd_.Txn(txn);
  if (!result.ok()) {
    const absl::Status& s = result.status();
    if (absl::IsResourceExhausted(s) || absl::StrContains(s.message(), "too large")) {
      return absl::ResourceExhaustedError(absl::StrCat(
          path_, ": ", what, ": the record is ", txn.ByteSizeLong(),
          " bytes, over etcd's request limit (--max-request-bytes, 1.5 MiB by default): ",
          s.message()));
    }
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  if (result->succeeded()) return absl::OkStatus();
  std::string now = "no coordinator leads now";
  if (result->responses_size() == 1 && result->responses(0).response_range().kvs_size() == 1) {
    now = absl::StrCat("the leader key was re-created at revision ",
                       result->responses(0).response_range().kvs(0).create_revision());
  }
  const std::string refused = absl::StrCat(
      "this coordinator no longer leads (fenced by etcd): ", what, " refused; it won ", fence_.key,
      " at revision ", fence_.create_revision, ", ", now, " (", etcd_.name(), ")");
  // Whoever wrote cannot be trusted to pass the status on (an event's
  // write is best effort), so the leadership hears of it here.
  if (options_.on_fenced) options_.on_fenced(refused);
  return absl::FailedPreconditionError(refused);
}

absl::Status EtcdStateStore::ForEachKey(
    const std::string& begin, const std::string& end, bool keys_only,
    const std::function<absl::Status(const etcdserverpb::KeyValue&)>& visit) {
  etcdserverpb::RangeRequest page;
  page.set_key(begin);
  page.set_range_end(end);
  page.set_limit(options_.page_size);
  page.set_keys_only(keys_only);
  while (true) {
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse response, etcd_.Range(page));
    for (const etcdserverpb::KeyValue& kv : response.kvs()) RETURN_IF_ERROR(visit(kv));
    if (!response.more() || response.kvs_size() == 0) return absl::OkStatus();
    // Pages after the first read at the first's revision: one consistent view.
    if (page.revision() == 0) page.set_revision(response.header().revision());
    page.set_key(response.kvs(response.kvs_size() - 1).key() + std::string(1, '\0'));
  }
}

namespace {

// Whether `dir` holds the marker `token` of cluster `cluster_id`
// (Note [Shared checkpoint directory]); `key` and `where` name the token.
absl::Status CheckMarker(const std::string& dir, const std::string& cluster_id,
                         const std::string& token, const std::string& key,
                         const std::string& where) {
  const std::string marker = dir + "/.chorus-shared-" + cluster_id;
  std::optional<std::string> found = ReadSmallFile(marker, 4096);
  if (found.has_value() && *found == token) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint directory ", dir, " is not the one this cluster's coordinators share: ",
      found.has_value() ? "its marker " : "it has no marker ", marker,
      found.has_value() ? " holds another token" : "", " (", key, " in ", where,
      "). With --state etcd://, --checkpoint_dir must be shared storage (NFS, a "
      "cluster file system) mounted at the same path on every coordinator; a PREFIX another "
      "cluster uses needs that cluster's directory, or choose another PREFIX"));
}

absl::StatusOr<std::optional<std::string>> GetValue(EtcdClient& etcd, const std::string& key) {
  etcdserverpb::RangeRequest get;
  get.set_key(key);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse response, etcd.Range(get));
  if (response.kvs_size() == 0) return std::optional<std::string>();
  return std::optional<std::string>(response.kvs(0).value());
}

}  // namespace

absl::StatusOr<std::optional<std::string>> EtcdStateStore::Get(const std::string& key) {
  return GetValue(etcd_, key);
}

absl::Status EtcdStateStore::Corrupt(absl::string_view what, absl::string_view key) const {
  return absl::DataLossError(absl::StrCat(path_, ": ", what, " at ", key, " is corrupt"));
}

std::string EtcdStateStore::JobKey(const std::string& job_id) const {
  return absl::StrCat(prefix_, "/jobs/", job_id);
}

std::string EtcdStateStore::EventKey(const std::string& job_id, int64_t seq) const {
  return absl::StrCat(prefix_, "/events/", job_id, "/", Pad(seq));
}

etcdserverpb::RequestOp EtcdStateStore::PutJob(const v1::Job& job) const {
  return Put(JobKey(job.job_id()), job.SerializeAsString());
}

etcdserverpb::RequestOp EtcdStateStore::PutJobOrder(const v1::Job& job) const {
  return Put(absl::StrCat(prefix_, "/job_order/", Pad(job.submit_time_us()), "/", job.job_id()),
             "");
}

absl::Status EtcdStateStore::SaveJob(const v1::Job& job) {
  return Write("saving job " + job.job_id(), {PutJob(job), PutJobOrder(job)});
}

absl::Status EtcdStateStore::AppendEvent(const v1::JobEvent& event) {
  RETURN_IF_ERROR(CheckNumber("an event's seq", event.job_id(), event.seq()));
  return Write("appending an event of " + event.job_id(),
               {Put(EventKey(event.job_id(), event.seq()), event.SerializeAsString())});
}

absl::Status EtcdStateStore::SaveJobAndEvent(const v1::Job& job, const v1::JobEvent& event) {
  RETURN_IF_ERROR(CheckNumber("an event's seq", event.job_id(), event.seq()));
  return Write("saving job " + job.job_id() + " and its event",
               {PutJob(job), PutJobOrder(job),
                Put(EventKey(event.job_id(), event.seq()), event.SerializeAsString())});
}

// Jobs in submission order: the job_order index a page at a time, and each
// page's jobs read in transactions of kReadsPerTxn ranges. An index entry
// whose job now has another submit time (or none) is stale and skipped.
absl::Status EtcdStateStore::ForEachJob(const std::function<void(v1::Job)>& visit) {
  const std::string order = prefix_ + "/job_order/";
  std::vector<std::pair<std::string, std::string>> indexed;  // (padded submit time, job id)
  auto read_indexed = [&]() -> absl::Status {
    etcdserverpb::TxnRequest reads;
    for (const auto& [time, id] : indexed) {
      reads.add_success()->mutable_request_range()->set_key(JobKey(id));
    }
    ASSIGN_OR_RETURN(etcdserverpb::TxnResponse response, etcd_.Txn(reads));
    for (int i = 0; i < response.responses_size(); ++i) {
      const etcdserverpb::RangeResponse& got = response.responses(i).response_range();
      if (got.kvs_size() == 0) continue;
      v1::Job job;
      if (!job.ParseFromString(got.kvs(0).value())) {
        return Corrupt("a job record", got.kvs(0).key());
      }
      if (Pad(job.submit_time_us()) == indexed[i].first) visit(std::move(job));
    }
    indexed.clear();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(ForEachKey(order, PrefixRangeEnd(order), /*keys_only=*/true,
                             [&](const etcdserverpb::KeyValue& kv) -> absl::Status {
                               const std::string rest = kv.key().substr(order.size());
                               const size_t slash = rest.find('/');
                               if (slash == std::string::npos) {
                                 return Corrupt("a job index key", kv.key());
                               }
                               indexed.emplace_back(rest.substr(0, slash), rest.substr(slash + 1));
                               if (indexed.size() < kReadsPerTxn) return absl::OkStatus();
                               return read_indexed();
                             }));
  return indexed.empty() ? absl::OkStatus() : read_indexed();
}

absl::StatusOr<v1::Job> EtcdStateStore::LoadJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(std::optional<std::string> value, Get(JobKey(job_id)));
  if (!value.has_value()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id, " in ", path_));
  }
  v1::Job job;
  if (!job.ParseFromString(*value)) return Corrupt("a job record", JobKey(job_id));
  return job;
}

absl::StatusOr<std::vector<v1::Job>> EtcdStateStore::LoadJobsBefore(const std::string& before_id,
                                                                    int limit) {
  std::vector<v1::Job> jobs;
  if (limit <= 0) return jobs;
  const std::string all = prefix_ + "/jobs/";
  etcdserverpb::RangeRequest range;
  range.set_key(all);
  range.set_range_end(before_id.empty() ? PrefixRangeEnd(all) : JobKey(before_id));
  range.set_limit(limit);
  range.set_sort_order(etcdserverpb::RangeRequest::DESCEND);
  range.set_sort_target(etcdserverpb::RangeRequest::KEY);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse response, etcd_.Range(range));
  for (const etcdserverpb::KeyValue& kv : response.kvs()) {
    v1::Job job;
    if (!job.ParseFromString(kv.value())) return Corrupt("a job record", kv.key());
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<int64_t> EtcdStateStore::LastEventSeq(const std::string& job_id) {
  const std::string events = absl::StrCat(prefix_, "/events/", job_id, "/");
  etcdserverpb::RangeRequest range;
  range.set_key(events);
  range.set_range_end(PrefixRangeEnd(events));
  range.set_limit(1);
  range.set_keys_only(true);
  range.set_sort_order(etcdserverpb::RangeRequest::DESCEND);
  range.set_sort_target(etcdserverpb::RangeRequest::KEY);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse response, etcd_.Range(range));
  if (response.kvs_size() == 0) return 0;
  return TrailingNumber(response.kvs(0).key());
}

absl::StatusOr<std::vector<v1::JobEvent>> EtcdStateStore::LoadEvents(const std::string& job_id,
                                                                     int64_t after_seq) {
  const std::string events = absl::StrCat(prefix_, "/events/", job_id, "/");
  std::vector<v1::JobEvent> out;
  RETURN_IF_ERROR(ForEachKey(EventKey(job_id, std::max<int64_t>(after_seq + 1, 0)),
                             PrefixRangeEnd(events), /*keys_only=*/false,
                             [&](const etcdserverpb::KeyValue& kv) -> absl::Status {
                               v1::JobEvent event;
                               if (!event.ParseFromString(kv.value())) {
                                 return Corrupt("an event record", kv.key());
                               }
                               out.push_back(std::move(event));
                               return absl::OkStatus();
                             }));
  return out;
}

absl::Status EtcdStateStore::SaveManifest(const v1::CheckpointManifest& manifest) {
  RETURN_IF_ERROR(CheckNumber("a checkpoint's step", manifest.job_id(), manifest.step()));
  return Write("saving a checkpoint manifest of " + manifest.job_id(),
               {Put(absl::StrCat(prefix_, "/manifests/", manifest.job_id(), "/",
                                 Pad(manifest.step())),
                    manifest.SerializeAsString())});
}

absl::Status EtcdStateStore::DeleteManifest(const std::string& job_id, int64_t step) {
  if (step < 0) return absl::OkStatus();  // never stored
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(
      absl::StrCat(prefix_, "/manifests/", job_id, "/", Pad(step)));
  return Write("deleting a checkpoint manifest of " + job_id, {std::move(op)});
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> EtcdStateStore::LoadManifests(
    const std::string& job_id) {
  const std::string manifests =
      job_id.empty() ? prefix_ + "/manifests/" : absl::StrCat(prefix_, "/manifests/", job_id, "/");
  std::vector<v1::CheckpointManifest> out;
  RETURN_IF_ERROR(ForEachKey(manifests, PrefixRangeEnd(manifests), /*keys_only=*/false,
                             [&](const etcdserverpb::KeyValue& kv) -> absl::Status {
                               v1::CheckpointManifest manifest;
                               if (!manifest.ParseFromString(kv.value())) {
                                 return Corrupt("a checkpoint manifest", kv.key());
                               }
                               out.push_back(std::move(manifest));
                               return absl::OkStatus();
                             }));
  // Keys sort "job-1/..." after "job-1-a/..." ('/' > '-'); SQLite's order is
  // by job id, then step.
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.job_id() != b.job_id() ? a.job_id() < b.job_id() : a.step() < b.step();
  });
  return out;
}

absl::Status EtcdStateStore::SaveElasticRecord(const std::string& job_id,
                                               const coordinator::ElasticRecord& record) {
  return Write("saving the elastic state of " + job_id,
               {Put(absl::StrCat(prefix_, "/elastic/", job_id), record.SerializeAsString())});
}

absl::StatusOr<coordinator::ElasticRecord> EtcdStateStore::LoadElasticRecord(
    const std::string& job_id) {
  const std::string key = absl::StrCat(prefix_, "/elastic/", job_id);
  ASSIGN_OR_RETURN(std::optional<std::string> value, Get(key));
  coordinator::ElasticRecord record;
  if (value.has_value() && !record.ParseFromString(*value)) {
    return Corrupt("the elastic state of " + job_id, key);
  }
  return record;
}

// Note [Shared checkpoint directory]
// Checkpoint payloads are files, not etcd values, so with the state in etcd
// they must be on storage that every coordinator mounts at the same
// --checkpoint_dir; a new leader on a local directory would otherwise list
// manifests whose files it cannot read, and the next retention pass would count
// them as lost. The first leader writes a file MARKER with a fresh random token
// into the directory and then the token into etcd (fenced); every later leader
// reads the token and requires the same file. (A crash between the two writes
// leaves a file no key names; the next leader writes a new one.)

absl::Status CheckSharedDirectory(EtcdClient& etcd, const std::string& prefix,
                                  const std::string& dir, const std::string& where) {
  ASSIGN_OR_RETURN(std::optional<std::string> cluster_id, GetValue(etcd, prefix + "/cluster_id"));
  const std::string key = prefix + "/checkpoint_dir_marker";
  ASSIGN_OR_RETURN(std::optional<std::string> token, GetValue(etcd, key));
  if (!cluster_id.has_value() || !token.has_value()) return absl::OkStatus();  // none claimed
  return CheckMarker(dir, *cluster_id, *token, key, where);
}

absl::Status EtcdStateStore::ClaimSharedDirectory(const std::string& dir) {
  const std::string key = prefix_ + "/checkpoint_dir_marker";
  const std::string marker = dir + "/.chorus-shared-" + cluster_id_;
  ASSIGN_OR_RETURN(std::optional<std::string> token, Get(key));
  if (token.has_value()) return CheckMarker(dir, cluster_id_, *token, key, path_);
  RETURN_IF_ERROR(MakePrivateDirectory(dir, "--checkpoint_dir"));
  const std::string fresh = NewClusterId() + NewClusterId();
  std::error_code ec;
  std::filesystem::remove(marker, ec);  // a marker no key names (see the Note)
  RETURN_IF_ERROR(WritePrivateFile(marker, fresh));
  return Write("saving the checkpoint directory's marker", {Put(key, fresh)});
}

// Note [Shared job credentials]
// A job's ranks hold a credential made by the leader that launched them
// (Note [Job credentials] in common/job_credentials.h) and present it to
// whichever coordinator leads later, so every coordinator must check it with
// the same secret. The secret lives in etcd, PREFIX/job_credentials_secret,
// written (fenced) by the first leader that needs it: its own
// --state_dir/job_credentials.key if it has one (a coordinator moving from
// SQLite to etcd keeps its running jobs' credentials valid), else a new one.
// Later leaders use etcd's and need no file. A leader whose file holds
// another secret refuses to start: it has been given a file on purpose, and
// silently preferring either secret would reject credentials someone relies
// on. Whoever can read PREFIX can mint job credentials, so etcd's access
// control (--etcd_user, TLS) must keep it to the coordinators.
absl::StatusOr<JobCredentials> EtcdStateStore::LoadJobCredentials(const std::string& local_path) {
  const std::string key = prefix_ + "/job_credentials_secret";
  ASSIGN_OR_RETURN(std::optional<JobCredentials> local,
                   JobCredentials::LoadIfPresent(local_path));
  ASSIGN_OR_RETURN(std::optional<std::string> shared, Get(key));
  if (shared.has_value()) {
    if (shared->size() < JobCredentials::kMinSecretChars) {
      return Corrupt("the job-credential secret", key);
    }
    JobCredentials credentials(*std::move(shared));
    if (local.has_value() && !local->SameSecretAs(credentials)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job-credential secret ", local_path, " differs from the one this cluster's "
          "coordinators share (", key, " in ", path_, "), so the credentials of jobs the "
          "others launched would be refused here. Remove ", local_path,
          " (this coordinator then uses the shared secret), or give it the shared one"));
    }
    return credentials;
  }
  std::optional<JobCredentials> chosen = std::move(local);
  if (!chosen.has_value()) {
    ASSIGN_OR_RETURN(chosen, JobCredentials::Create());
  }
  RETURN_IF_ERROR(Write("saving the job-credential secret", {Put(key, chosen->secret())}));
  return *std::move(chosen);
}

}  // namespace chorus
