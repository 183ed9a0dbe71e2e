#include "coordinator/state/state_store.h"

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/private_files.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

constexpr char kSchema[] = R"sql(
  CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    submit_time_us INTEGER NOT NULL,
    job BLOB NOT NULL              -- serialized chorus.v1.Job
  );
  CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,           -- serialized chorus.v1.JobEvent
    PRIMARY KEY (job_id, seq)
  );
  CREATE TABLE IF NOT EXISTS checkpoints (
    job_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    manifest BLOB NOT NULL,        -- serialized chorus.v1.CheckpointManifest
    PRIMARY KEY (job_id, step)
  );
  CREATE TABLE IF NOT EXISTS cluster (
    id TEXT NOT NULL               -- one row: StateStore::cluster_id()
  );
  CREATE TABLE IF NOT EXISTS elastic_records (
    job_id TEXT PRIMARY KEY,
    record BLOB NOT NULL           -- serialized chorus.coordinator.ElasticRecord
  );
)sql";

// Note [A bounded page cache]
// SQLite caches up to 2 MB of database pages by default, and a coordinator's
// database grows by a couple of kilobytes per job, so the cache itself grew the
// coordinator by ~1 MB per 1,000 jobs until it was full. The tables are written
// at the end and read by key, so the interior pages of their B-trees are what
// is worth keeping: 512 KiB holds them for millions of rows, and the kernel's
// page cache holds the rest.
constexpr char kCacheSize[] = "PRAGMA cache_size=-512;";

// Finalizes a prepared statement when it goes out of scope.
struct Statement {
  sqlite3_stmt* stmt = nullptr;
  ~Statement() { sqlite3_finalize(stmt); }
};

// Reads column `column` of the statement's current row as a `Message`.
template <typename Message>
bool ParseColumn(sqlite3_stmt* stmt, int column, Message& message) {
  return message.ParseFromArray(sqlite3_column_blob(stmt, column),
                                sqlite3_column_bytes(stmt, column));
}

}  // namespace

// 12 random hex digits: with a few thousand clusters sharing one directory,
// the chance that two draw the same id is below 1e-7.
std::string NewClusterId() {
  std::random_device random;
  const uint64_t bits = (uint64_t{random()} << 32) ^ random();
  return absl::StrFormat("%012x", bits & 0xffffffffffffULL);
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteStateStore> store, SqliteStateStore::Open(dir));
  return std::unique_ptr<StateStore>(std::move(store));
}

absl::StatusOr<std::vector<v1::Job>> StateStore::LoadJobs() {
  std::vector<v1::Job> jobs;
  RETURN_IF_ERROR(ForEachJob([&](v1::Job job) { jobs.push_back(std::move(job)); }));
  return jobs;
}

absl::StatusOr<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(const std::string& dir) {
  const std::string path = dir + "/chorus.db";
  // Note [Private files]: the database holds every job's spec, program.env
  // values included. SQLite makes its -wal and -shm files with the mode of
  // the database file, so a database made 0600 keeps them 0600 too; files
  // an older coordinator left with a wider mode are tightened.
  if (absl::Status s = MakePrivateDirectory(dir, "state directory"); !s.ok()) return s;
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string file = path + suffix;
    std::error_code ec;
    if (*suffix != '\0' && !std::filesystem::exists(file, ec)) continue;
    if (absl::Status s = MakePrivateFile(file); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("state database: ", s.message()));
    }
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("state database ", path, ": ", message));
  }
  std::unique_ptr<SqliteStateStore> store(new SqliteStateStore(db, path));
  {
    absl::MutexLock lock(&store->mu_);
    // WAL + FULL sync: a commit is on disk before SaveJob returns.
    for (const char* pragma : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;",
                               "PRAGMA busy_timeout=5000;", kCacheSize, kSchema}) {
      absl::Status s = store->Exec(pragma);
      if (!s.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(s.message(), " (is ", path, " a Chorus state database?)"));
      }
    }
    absl::StatusOr<std::string> id = store->LoadOrCreateClusterId();
    if (!id.ok()) return absl::FailedPreconditionError(id.status().message());
    store->cluster_id_ = *std::move(id);
  }
  return store;
}

absl::StatusOr<std::string> SqliteStateStore::LoadOrCreateClusterId() {
  {
    Statement st;
    if (sqlite3_prepare_v2(db_, "SELECT id FROM cluster LIMIT 1", -1, &st.stmt, nullptr) !=
        SQLITE_OK) {
      return Error("prepare");
    }
    const int rc = sqlite3_step(st.stmt);
    if (rc == SQLITE_ROW) {
      return std::string(reinterpret_cast<const char*>(sqlite3_column_text(st.stmt, 0)));
    }
    if (rc != SQLITE_DONE) return Error("reading the cluster id");
  }
  const std::string id = NewClusterId();
  Statement st;
  if (sqlite3_prepare_v2(db_, "INSERT INTO cluster (id) VALUES (?)", -1, &st.stmt, nullptr) !=
      SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.stmt) != SQLITE_DONE) return Error("saving the cluster id");
  return id;
}

SqliteStateStore::~SqliteStateStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status SqliteStateStore::Error(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("state database ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status SqliteStateStore::Exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : "unknown error";
    sqlite3_free(error);
    return absl::UnavailableError(absl::StrCat("state database ", path_, ": ", message));
  }
  return absl::OkStatus();
}

absl::Status SqliteStateStore::SaveJob(const v1::Job& job) {
  absl::MutexLock lock(&mu_);
  return SaveJobLocked(job);
}

absl::Status SqliteStateStore::AppendEvent(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  return AppendEventLocked(event);
}

// Note [One commit per change]
// A job's state change and its event are one transaction: a crash between two
// commits would leave a job whose state has no event (a watcher would never see
// it end), and every commit is a synchronous write to the disk, which a loaded
// machine takes its time over.
absl::Status SqliteStateStore::SaveJobAndEvent(const v1::Job& job, const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  absl::Status status = SaveJobLocked(job);
  if (status.ok()) status = AppendEventLocked(event);
  if (status.ok()) status = Exec("COMMIT;");
  if (!status.ok()) (void)Exec("ROLLBACK;");
  return status;
}

absl::Status SqliteStateStore::SaveJobLocked(const v1::Job& job) {
  const std::string blob = job.SerializeAsString();
  Statement st;
  if (sqlite3_prepare_v2(
          db_, "INSERT OR REPLACE INTO jobs (job_id, submit_time_us, job) VALUES (?, ?, ?)", -1,
          &st.stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job.job_id().data(), static_cast<int>(job.job_id().size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.stmt, 2, job.submit_time_us());
  sqlite3_bind_blob(st.stmt, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.stmt) != SQLITE_DONE) return Error("saving job " + job.job_id());
  return absl::OkStatus();
}

absl::Status SqliteStateStore::AppendEventLocked(const v1::JobEvent& event) {
  const std::string blob = event.SerializeAsString();
  Statement st;
  if (sqlite3_prepare_v2(db_, "INSERT INTO events (job_id, seq, event) VALUES (?, ?, ?)", -1,
                         &st.stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, event.job_id().data(), static_cast<int>(event.job_id().size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.stmt, 2, event.seq());
  sqlite3_bind_blob(st.stmt, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.stmt) != SQLITE_DONE) return Error("appending an event of " + event.job_id());
  return absl::OkStatus();
}

absl::Status SqliteStateStore::ForEachJob(const std::function<void(v1::Job)>& visit) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_, "SELECT job FROM jobs ORDER BY submit_time_us, job_id", -1, &st.stmt,
                         nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  int rc;
  while ((rc = sqlite3_step(st.stmt)) == SQLITE_ROW) {
    v1::Job job;
    if (!ParseColumn(st.stmt, 0, job)) {
      return absl::DataLossError(
          absl::StrCat("state database ", path_, ": a job record is corrupt"));
    }
    visit(std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("loading jobs");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> SqliteStateStore::ReadJobs(sqlite3_stmt* stmt) {
  std::vector<v1::Job> jobs;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    v1::Job job;
    if (!ParseColumn(stmt, 0, job)) {
      return absl::DataLossError(
          absl::StrCat("state database ", path_, ": a job record is corrupt"));
    }
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("loading jobs");
  return jobs;
}

absl::StatusOr<v1::Job> SqliteStateStore::LoadJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_, "SELECT job FROM jobs WHERE job_id = ?", -1, &st.stmt, nullptr) !=
      SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, ReadJobs(st.stmt));
  if (jobs.empty()) return absl::NotFoundError(absl::StrCat("no job ", job_id, " in ", path_));
  return std::move(jobs.front());
}

absl::StatusOr<std::vector<v1::Job>> SqliteStateStore::LoadJobsBefore(const std::string& before_id,
                                                                      int limit) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(
          db_, "SELECT job FROM jobs WHERE ?1 = '' OR job_id < ?1 ORDER BY job_id DESC LIMIT ?2",
          -1, &st.stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, before_id.data(), static_cast<int>(before_id.size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int(st.stmt, 2, limit);
  return ReadJobs(st.stmt);
}

absl::StatusOr<int64_t> SqliteStateStore::LastEventSeq(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_, "SELECT MAX(seq) FROM events WHERE job_id = ?", -1, &st.stmt,
                         nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.stmt) != SQLITE_ROW) return Error("reading the events of " + job_id);
  return sqlite3_column_int64(st.stmt, 0);  // NULL (no events) reads as 0
}

absl::StatusOr<std::vector<v1::JobEvent>> SqliteStateStore::LoadEvents(const std::string& job_id,
                                                                       int64_t after_seq) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_, "SELECT event FROM events WHERE job_id = ? AND seq > ? ORDER BY seq",
                         -1, &st.stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.stmt, 2, after_seq);
  std::vector<v1::JobEvent> events;
  int rc;
  while ((rc = sqlite3_step(st.stmt)) == SQLITE_ROW) {
    v1::JobEvent event;
    if (!ParseColumn(st.stmt, 0, event)) {
      return absl::DataLossError(
          absl::StrCat("state database ", path_, ": an event record is corrupt"));
    }
    events.push_back(std::move(event));
  }
  if (rc != SQLITE_DONE) return Error("loading events");
  return events;
}

absl::Status SqliteStateStore::SaveManifest(const v1::CheckpointManifest& manifest) {
  const std::string blob = manifest.SerializeAsString();
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(
          db_, "INSERT OR REPLACE INTO checkpoints (job_id, step, manifest) VALUES (?, ?, ?)", -1,
          &st.stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, manifest.job_id().data(),
                    static_cast<int>(manifest.job_id().size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.stmt, 2, manifest.step());
  sqlite3_bind_blob(st.stmt, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.stmt) != SQLITE_DONE)
    return Error("saving a checkpoint manifest of " + manifest.job_id());
  return absl::OkStatus();
}

absl::Status SqliteStateStore::DeleteManifest(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?", -1, &st.stmt,
                         nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.stmt, 2, step);
  if (sqlite3_step(st.stmt) != SQLITE_DONE)
    return Error("deleting a checkpoint manifest of " + job_id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::CheckpointManifest>> SqliteStateStore::LoadManifests(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement st;
  const char* sql = job_id.empty()
                        ? "SELECT manifest FROM checkpoints ORDER BY job_id, step"
                        : "SELECT manifest FROM checkpoints WHERE job_id = ? ORDER BY step";
  if (sqlite3_prepare_v2(db_, sql, -1, &st.stmt, nullptr) != SQLITE_OK) return Error("prepare");
  if (!job_id.empty()) {
    sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  }
  std::vector<v1::CheckpointManifest> out;
  int rc;
  while ((rc = sqlite3_step(st.stmt)) == SQLITE_ROW) {
    v1::CheckpointManifest m;
    if (!m.ParseFromArray(sqlite3_column_blob(st.stmt, 0), sqlite3_column_bytes(st.stmt, 0))) {
      return absl::DataLossError(
          absl::StrCat("state database ", path_, ": a checkpoint manifest is corrupt"));
    }
    out.push_back(std::move(m));
  }
  if (rc != SQLITE_DONE) return Error("loading checkpoint manifests");
  return out;
}

absl::Status SqliteStateStore::SaveElasticRecord(const std::string& job_id,
                                                 const coordinator::ElasticRecord& record) {
  const std::string blob = record.SerializeAsString();
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_,
                         "INSERT OR REPLACE INTO elastic_records (job_id, record) VALUES (?, ?)",
                         -1, &st.stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  sqlite3_bind_blob(st.stmt, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st.stmt) != SQLITE_DONE) return Error("saving the elastic state of " + job_id);
  return absl::OkStatus();
}

absl::StatusOr<coordinator::ElasticRecord> SqliteStateStore::LoadElasticRecord(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement st;
  if (sqlite3_prepare_v2(db_, "SELECT record FROM elastic_records WHERE job_id = ?", -1, &st.stmt,
                         nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  sqlite3_bind_text(st.stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  coordinator::ElasticRecord record;
  const int rc = sqlite3_step(st.stmt);
  if (rc == SQLITE_ROW &&
      !record.ParseFromArray(sqlite3_column_blob(st.stmt, 0), sqlite3_column_bytes(st.stmt, 0))) {
    return absl::DataLossError(
        absl::StrCat("state database ", path_, ": the elastic state of ", job_id, " is corrupt"));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("loading the elastic state of " + job_id);
  return record;
}

}  // namespace chorus
