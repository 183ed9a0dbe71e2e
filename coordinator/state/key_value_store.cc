#include "coordinator/state/key_value_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace chorus {

std::string KeyValueStore::JobOfNamespace(const std::string& ns) {
  return ns.substr(0, ns.find('/'));
}

KeyValueStore::KeyValueStore(Clock* clock) : KeyValueStore(clock, Limits()) {}

KeyValueStore::KeyValueStore(Clock* clock, Limits limits)
    : clock_(clock != nullptr ? clock : &real_clock_), limits_(limits) {
  expiry_ = std::thread([this] { ExpireLoop(); });
}

KeyValueStore::~KeyValueStore() {
  std::map<uint64_t, Waiter> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    left.swap(waiters_);
  }
  expiry_.join();
  for (auto& [id, w] : left) w.done(absl::UnavailableError("coordinator store shutting down"));
}

bool KeyValueStore::AllSet(const Waiter& w) const {
  return std::all_of(w.keys.begin(), w.keys.end(), [&](const std::string& k) {
    return values_.count({w.ns, k}) > 0;
  });
}

std::vector<std::string> KeyValueStore::Missing(const Waiter& w) const {
  std::vector<std::string> missing;
  for (const std::string& k : w.keys) {
    if (!values_.count({w.ns, k})) missing.push_back(k);
  }
  return missing;
}

std::vector<KeyValueStore::Waiter> KeyValueStore::TakeSatisfied(const std::string& ns) {
  std::vector<Waiter> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.ns == ns && AllSet(it->second)) {
      ready.push_back(std::move(it->second));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

absl::Status KeyValueStore::Put(const std::string& ns, const std::string& key, std::string value) {
  const std::string job = JobOfNamespace(ns);
  if (value.size() > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store: job \"", job, "\": the value of key \"", key, "\" is ", value.size(),
                     " bytes, more than the limit of ", limits_.max_value_bytes,
                     " bytes per value (coordinator flag --store_max_value_bytes)"));
  }
  Usage& usage = usage_[job];
  auto it = values_.find({ns, key});
  const bool is_new = it == values_.end();
  const size_t old_bytes = is_new ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (is_new && usage.keys >= limits_.max_keys_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store: job \"", job, "\" already holds ", usage.keys, " keys, the limit of ",
                     limits_.max_keys_per_job,
                     " per job (coordinator flag --store_max_keys_per_job); key \"", key,
                     "\" was not set. Rendezvous needs a few keys per rank and generation: a job "
                     "that reaches this writes keys in a loop"));
  }
  if (usage.bytes - old_bytes + new_bytes > limits_.max_bytes_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "store: job \"", job, "\" would hold ", usage.bytes - old_bytes + new_bytes,
        " bytes of keys and values, more than the limit of ", limits_.max_bytes_per_job,
        " per job (coordinator flag --store_max_bytes_per_job); key \"", key, "\" was not set"));
  }
  usage.bytes = usage.bytes - old_bytes + new_bytes;
  if (is_new) {
    ++usage.keys;
    values_.emplace(Key{ns, key}, std::move(value));
  } else {
    it->second = std::move(value);
  }
  return absl::OkStatus();
}

KeyValueStore::Usage KeyValueStore::UsageOf(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(job);
  return it == usage_.end() ? Usage() : it->second;
}

std::vector<std::string> KeyValueStore::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [job, usage] : usage_) jobs.push_back(job);
  return jobs;
}

void KeyValueStore::DropJob(const std::string& job) {
  std::vector<Waiter> aborted;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = values_.begin(); it != values_.end();) {
      it = JobOfNamespace(it->first.first) == job ? values_.erase(it) : std::next(it);
    }
    usage_.erase(job);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (JobOfNamespace(it->second.ns) == job) {
        aborted.push_back(std::move(it->second));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Waiter& w : aborted) {
    w.done(absl::AbortedError(
        absl::StrCat("coordinator store: job ", job, " has ended; its keys are gone")));
  }
}

absl::Status KeyValueStore::Set(const std::string& ns, const std::string& key, std::string value) {
  std::vector<Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Put(ns, key, std::move(value)));
    ready = TakeSatisfied(ns);
  }
  for (Waiter& w : ready) w.done(absl::OkStatus());
  return absl::OkStatus();
}

std::optional<std::string> KeyValueStore::Get(const std::string& ns, const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find({ns, key});
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<int64_t> KeyValueStore::Add(const std::string& ns, const std::string& key,
                                           int64_t delta) {
  std::vector<Waiter> ready;
  int64_t value = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find({ns, key});
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("store: Add on key \"", key, "\", which holds a non-integer value"));
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return absl::OutOfRangeError(
          absl::StrCat("store: Add of ", delta, " on key \"", key, "\" leaves the 64-bit range"));
    }
    RETURN_IF_ERROR(Put(ns, key, std::to_string(value)));
    ready = TakeSatisfied(ns);
  }
  for (Waiter& w : ready) w.done(absl::OkStatus());
  return value;
}

uint64_t KeyValueStore::WaitFor(const std::string& ns, std::vector<std::string> keys,
                                absl::Time deadline, Done done) {
  if (keys.size() > kMaxWaitKeys) {
    done(absl::InvalidArgumentError(
        absl::StrCat("store: a wait may name at most ", kMaxWaitKeys, " keys, got ", keys.size())));
    return 0;
  }
  Waiter w{ns, std::move(keys), deadline, std::move(done)};
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      now = absl::UnavailableError("coordinator store shutting down");
    } else if (!AllSet(w)) {
      const uint64_t id = next_id_++;
      waiters_.emplace(id, std::move(w));
      return id;
    }
  }
  w.done(now);  // already satisfied (OK) or shutting down
  return 0;
}

void KeyValueStore::Cancel(uint64_t id) {
  std::optional<Waiter> w;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    w = std::move(it->second);
    waiters_.erase(it);
  }
  w->done(absl::CancelledError("wait cancelled by the client"));
}

size_t KeyValueStore::pending_waits() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

void KeyValueStore::ExpireLoop() {
  while (true) {
    std::vector<std::pair<Waiter, std::vector<std::string>>> expired;
    {
      absl::MutexLock lock(&mu_);
      // Short slices so that a FakeClock's jumps are seen promptly.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(10));
      if (stopping_) return;
      const absl::Time now = clock_->Now();
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->second.deadline <= now) {
          std::vector<std::string> missing = Missing(it->second);
          expired.emplace_back(std::move(it->second), std::move(missing));
          it = waiters_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& [w, missing] : expired) {
      w.done(absl::DeadlineExceededError(
          absl::StrCat("coordinator store: namespace \"", w.ns,
                       "\": these keys were never set: ", absl::StrJoin(missing, ", "))));
    }
  }
}

}  // namespace chorus
