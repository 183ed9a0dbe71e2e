#include "worker/comm/gloo_store.h"

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace chorus {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  throw gloo::IoException(
      absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_.Set(key, absl::string_view(data.data(), data.size()));
  if (!status.ok()) Throw(status);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_.Get(key, absl::Now() + timeout_);
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  absl::Status status = store_.Wait(keys, absl::Now() + timeout_);
  if (!status.ok()) Throw(status);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  absl::Status status = store_.Wait(keys, absl::Now() + absl::FromChrono(timeout));
  if (!status.ok()) Throw(status);
}

}  // namespace chorus
