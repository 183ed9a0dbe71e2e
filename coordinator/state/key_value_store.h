// KeyValueStore: the coordinator's rendezvous store, behind StoreService.
//
// Keys live in namespaces (a job and generation, e.g. "job-7/gen-2"). Waits
// never hold a thread: WaitFor registers a callback that runs exactly once —
// when every key is set, when the deadline passes (DEADLINE_EXCEEDED naming
// the missing keys), when the wait is cancelled, or when the store shuts down.
// gRPC reactors finish their calls from those callbacks.
//
// Note [Store quotas]
// Quotas count per job: the job is the namespace up to its first '/'
// ("job-7" for "job-7/gen-2"). Each job may hold at most
// limits.max_keys_per_job keys and limits.max_bytes_per_job bytes of keys
// and values over all its namespaces, and no value may exceed
// limits.max_value_bytes; a Set or Add beyond them is RESOURCE_EXHAUSTED
// naming the job, the limit and the coordinator flag that sets it, and
// changes nothing. A job's rendezvous needs a few keys per rank and
// generation, so the defaults stop only a runaway writer, and one job at
// its quota leaves the other jobs' stores working.
//
// Thread-safety: every method may be called from any thread. Callbacks run
// without the store's lock held, on the thread that set the last key, on the
// store's expiry thread, or on the caller of Cancel().
//
// Example:
//   KeyValueStore::Limits limits;
//   limits.max_keys_per_job = 1000;
//   KeyValueStore kv(&clock, limits);
//   kv.WaitFor("job/gen0", {"0", "1"}, clock.Now() + absl::Seconds(30),
//              [](absl::Status s) { ... });
//   kv.Set("job/gen0", "0", "addr0");
#ifndef CHORUS_COORDINATOR_STATE_KEY_VALUE_STORE_H_
#define CHORUS_COORDINATOR_STATE_KEY_VALUE_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace chorus {

class KeyValueStore {
 public:
  // Default of Limits::max_value_bytes (the coordinator's gRPC messages
  // are limited to 32 MB).
  static constexpr size_t kMaxValueBytes = 16 << 20;
  // Most keys one wait may name.
  static constexpr size_t kMaxWaitKeys = 4096;

  // Per-job quotas; the flags named are the coordinator's (main.cc).
  struct Limits {
    size_t max_keys_per_job = 100000;              // --store_max_keys_per_job
    size_t max_bytes_per_job = size_t{256} << 20;  // --store_max_bytes_per_job (keys + values)
    size_t max_value_bytes = kMaxValueBytes;       // --store_max_value_bytes
  };

  using Done = std::function<void(absl::Status)>;

  // `clock` (not owned; null = real time) must outlive the store.
  explicit KeyValueStore(Clock* clock = nullptr);
  KeyValueStore(Clock* clock, Limits limits);
  KeyValueStore(const KeyValueStore&) = delete;
  KeyValueStore& operator=(const KeyValueStore&) = delete;
  // Finishes every pending wait with UNAVAILABLE and joins the expiry thread.
  ~KeyValueStore();

  absl::Status Set(const std::string& ns, const std::string& key, std::string value);
  std::optional<std::string> Get(const std::string& ns, const std::string& key) const;
  // Adds `delta` to the decimal integer at key (0 if unset). INVALID_ARGUMENT
  // if the key holds something else, OUT_OF_RANGE if the sum does not fit in
  // 64 bits (the value stays as it was).
  absl::StatusOr<int64_t> Add(const std::string& ns, const std::string& key, int64_t delta);

  // Calls `done` once all `keys` of `ns` are set (at once if they already
  // are), or with the reason it gave up. Returns an id for Cancel().
  uint64_t WaitFor(const std::string& ns, std::vector<std::string> keys, absl::Time deadline,
                   Done done);
  // Finishes wait `id` with CANCELLED if it is still pending.
  void Cancel(uint64_t id);

  size_t pending_waits() const;
  // Keys and bytes (keys + values) `job` holds over all its namespaces.
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  Usage UsageOf(const std::string& job) const;
  // The jobs that hold keys now.
  std::vector<std::string> Jobs() const;
  // Forgets every key of `job`'s namespaces and fails their waits with
  // ABORTED: for jobs that have ended, so that a long-running coordinator's
  // store holds only live jobs' keys (the server drops ended jobs' keys).
  void DropJob(const std::string& job);
  const Limits& limits() const { return limits_; }

  // The job namespace `ns` belongs to: `ns` up to its first '/' (Note
  // [Store quotas]); what quotas count and a job's credential may reach.
  static std::string JobOfNamespace(const std::string& ns);

 private:
  struct Waiter {
    std::string ns;
    std::vector<std::string> keys;
    absl::Time deadline;
    Done done;
  };
  using Key = std::pair<std::string, std::string>;

  bool AllSet(const Waiter& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> Missing(const Waiter& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes and returns the waiters of `ns` that are now satisfied.
  std::vector<Waiter> TakeSatisfied(const std::string& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value` at (ns, key) if the job's quota allows it, keeping the
  // job's usage current; RESOURCE_EXHAUSTED (nothing changed) otherwise.
  absl::Status Put(const std::string& ns, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLoop();

  RealClock real_clock_;
  Clock* const clock_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<Key, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);  // by job
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread expiry_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_KEY_VALUE_STORE_H_
