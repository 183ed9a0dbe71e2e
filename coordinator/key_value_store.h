// KeyValueStore: the coordinator's rendezvous store, behind StoreService.
//
// Keys live in namespaces (a job and generation, e.g. "job-7/gen-2"). Waits
// never hold a thread: WaitFor registers a callback that runs exactly once —
// when every key is set, when the deadline passes (DEADLINE_EXCEEDED naming
// the missing keys), when the wait is cancelled, or when the store shuts down.
// gRPC reactors finish their calls from those callbacks.
//
// Thread-safety: every method may be called from any thread. Callbacks run
// without the store's lock held, on the thread that set the last key, on the
// store's expiry thread, or on the caller of Cancel().
//
// Example:
//   KeyValueStore kv(&clock);
//   kv.WaitFor("job/gen0", {"0", "1"}, clock.Now() + absl::Seconds(30),
//              [](absl::Status s) { ... });
//   kv.Set("job/gen0", "0", "addr0");
#ifndef CHORUS_COORDINATOR_KEY_VALUE_STORE_H_
#define CHORUS_COORDINATOR_KEY_VALUE_STORE_H_

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
  // Largest value accepted by Set (bigger ones are INVALID_ARGUMENT).
  static constexpr size_t kMaxValueBytes = 16 << 20;
  // Most keys one wait may name.
  static constexpr size_t kMaxWaitKeys = 4096;

  using Done = std::function<void(absl::Status)>;

  // `clock` (not owned; null = real time) must outlive the store.
  explicit KeyValueStore(Clock* clock = nullptr);
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
  void ExpireLoop();

  RealClock real_clock_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<Key, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread expiry_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_KEY_VALUE_STORE_H_
