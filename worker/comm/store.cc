#include "worker/comm/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/backoff.h"

namespace chorus {

absl::Status MissingKeysError(absl::string_view store, absl::Span<const std::string> missing,
                              absl::Duration waited) {
  return absl::DeadlineExceededError(
      absl::StrCat(store, ": waited ", absl::FormatDuration(waited),
                   " and these keys were never set: ", absl::StrJoin(missing, ", ")));
}

namespace {

absl::StatusOr<int64_t> ParseCounter(absl::string_view key, absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: Add on key \"", key, "\", which holds a non-integer value"));
  }
  return value;
}

}  // namespace

// ---------------------------------------------------------------- MemoryStore

MemoryStore::MemoryStore(Clock* clock) : clock_(clock != nullptr ? clock : &real_clock_) {}

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::Get(absl::string_view key, absl::Time deadline) {
  std::string k(key);
  absl::Status waited = Wait(absl::MakeConstSpan(&k, 1), deadline);
  if (!waited.ok()) return waited;
  absl::MutexLock lock(&mu_);
  return values_.find(k)->second;
}

absl::Status MemoryStore::Wait(absl::Span<const std::string> keys, absl::Time deadline) {
  const absl::Time start = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto all_set = [this, keys]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(keys.begin(), keys.end(),
                       [this](const std::string& k) { return values_.count(k) > 0; });
  };
  if (clock_->AwaitWithDeadline(mu_, absl::Condition(&all_set), deadline)) {
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (!values_.count(k)) missing.push_back(k);
  }
  return MissingKeysError("memory store", missing, clock_->Now() - start);
}

absl::StatusOr<int64_t> MemoryStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  int64_t value = 0;
  if (it != values_.end()) {
    absl::StatusOr<int64_t> current = ParseCounter(key, it->second);
    if (!current.ok()) return current.status();
    value = *current;
  }
  value += delta;
  values_[std::string(key)] = std::to_string(value);
  return value;
}

// ---------------------------------------------------------------- FileStore

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("file store ", dir, ": cannot create: ", ec.message()));
  }
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::PathOf(absl::string_view key) const {
  // Hex keeps any key (slashes, dots) a single safe file name.
  return absl::StrCat(dir_, "/k-", absl::BytesToHexString(key));
}

absl::Status FileStore::WriteAtomically(absl::string_view key, absl::string_view value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  const std::string tmp = absl::StrCat(dir_, "/.tmp-", ::getpid(), "-", counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      return absl::UnavailableError(absl::StrCat("file store ", dir_, ": cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("file store ", dir_, ": cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  return WriteAtomically(key, value);
}

absl::Status FileStore::Wait(absl::Span<const std::string> keys, absl::Time deadline) {
  const absl::Time start = absl::Now();
  // Note [Backoff] in common/backoff.cc: ranks polling the same directory
  // do not look in lock step.
  BackoffOptions delays;
  delays.initial = absl::Microseconds(200);
  delays.max = absl::Milliseconds(20);
  Backoff backoff(delays);
  while (true) {
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      if (::access(PathOf(k).c_str(), F_OK) != 0) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) return MissingKeysError("file store " + dir_, missing, now - start);
    absl::SleepFor(backoff.NextWithin(deadline, now));
  }
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Time deadline) {
  std::string k(key);
  absl::Status waited = Wait(absl::MakeConstSpan(&k, 1), deadline);
  if (!waited.ok()) return waited;
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) {
    return absl::UnavailableError(absl::StrCat("file store ", dir_, ": cannot read key ", key));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  const std::string lock_path = dir_ + "/.lock";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("file store ", dir_, ": cannot open lock: ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("file store ", dir_, ": cannot lock: ", std::strerror(errno)));
  }
  int64_t value = delta;
  absl::Status status;
  std::ifstream in(PathOf(key), std::ios::binary);
  if (in) {
    std::stringstream buffer;
    buffer << in.rdbuf();
    absl::StatusOr<int64_t> current = ParseCounter(key, buffer.str());
    if (current.ok()) {
      value += *current;
    } else {
      status = current.status();
    }
  }
  if (status.ok()) status = WriteAtomically(key, std::to_string(value));
  ::flock(fd, LOCK_UN);
  ::close(fd);
  if (!status.ok()) return status;
  return value;
}

// ---------------------------------------------------------------- PrefixStore

std::string PrefixStore::Full(absl::string_view key) const { return absl::StrCat(prefix_, key); }

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return base_.Set(Full(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key, absl::Time deadline) {
  return base_.Get(Full(key), deadline);
}

absl::Status PrefixStore::Wait(absl::Span<const std::string> keys, absl::Time deadline) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(Full(k));
  return base_.Wait(full, deadline);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  return base_.Add(Full(key), delta);
}

}  // namespace chorus
