// Store: the key-value store ranks use to find each other (rendezvous).
//
// Gloo publishes its TCP addresses through it and NCCL its unique id; the
// coordinator serves one over gRPC (StoreService) for real jobs. Values are
// bytes; Add() keeps a decimal counter that Get() reads back as text.
//
// Every blocking call takes an absolute deadline and returns
// DEADLINE_EXCEEDED naming the keys still missing when it passes.
//
// Thread-safety: implementations are safe for concurrent use.
//
// Example:
//   MemoryStore store;
//   RETURN_IF_ERROR(store.Set("rank0/addr", bytes));
//   ASSIGN_OR_RETURN(std::string peer, store.Get("rank1/addr", absl::Now() + absl::Seconds(30)));
//   ASSIGN_OR_RETURN(int64_t arrived, store.Add("arrived", 1));
#ifndef CHORUS_WORKER_COMM_STORE_H_
#define CHORUS_WORKER_COMM_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"

namespace chorus {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value, and wakes waiters.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value of `key`, waiting for it to be set until `deadline`.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) = 0;
  // Returns once every key in `keys` is set, or DEADLINE_EXCEEDED at `deadline`.
  virtual absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) = 0;
  // Adds `delta` to the integer at `key` (0 if unset) and returns the new value.
  // INVALID_ARGUMENT if `key` holds something that is not an integer.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
};

// DEADLINE_EXCEEDED naming `missing`; shared by the implementations.
absl::Status MissingKeysError(absl::string_view store, absl::Span<const std::string> missing,
                              absl::Duration waited);

// Keys live in a map in this process; for ranks that are threads.
class MemoryStore : public Store {
 public:
  // `clock` (not owned, may be null for real time) must outlive the store.
  explicit MemoryStore(Clock* clock = nullptr);
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  RealClock real_clock_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> values_ ABSL_GUARDED_BY(mu_);
};

// Keys are files in a directory every rank can see (one machine, or a shared
// filesystem); for ranks that are processes without a coordinator, such as
// tests and benchmarks. Writes are atomic (write + rename); Add holds an
// exclusive flock on the directory's lock file.
class FileStore : public Store {
 public:
  // Creates `dir` if needed. FAILED_PRECONDITION if it cannot.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& dir);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(absl::string_view key) const;
  absl::Status WriteAtomically(absl::string_view key, absl::string_view value);

  const std::string dir_;
};

// Every key of `base` under "prefix/": namespaces jobs, generations and
// sub-groups in one store. `base` is not owned and must outlive this.
class PrefixStore : public Store {
 public:
  PrefixStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix) + "/") {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  std::string Full(absl::string_view key) const;
  Store& base_;
  const std::string prefix_;
};

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_STORE_H_
