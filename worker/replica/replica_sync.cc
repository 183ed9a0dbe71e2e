#include "worker/replica/replica_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

// FNV-1a: a hash that is the same in every process, for comparing parameter
// sets across ranks.
int64_t StableHash(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

std::string Describe(const NamedTensor& t) {
  return absl::StrCat("'", t.name, "' ", c10::toString(t.tensor.scalar_type()), "[",
                      absl::StrJoin(t.tensor.sizes(), ","), "]",
                      t.tensor.requires_grad() ? "" : " (no grad)");
}

// The host values as a tensor on `comm`'s device, and back.
at::Tensor ToComm(const std::vector<int64_t>& values, const Communicator& comm) {
  at::Tensor host = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::copy(values.begin(), values.end(), host.data_ptr<int64_t>());
  return host.to(comm.device());
}

std::vector<int64_t> FromComm(const at::Tensor& t) {
  at::Tensor host = t.to(at::kCPU).contiguous();
  const int64_t* p = host.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + host.numel());
}

}  // namespace

absl::Status CheckReplicasAgree(const std::vector<NamedTensor>& all, Communicator& comm,
                                absl::string_view who, absl::Time deadline) {
  const std::string tag = absl::StrCat(who, "/check");
  const int64_t count = static_cast<int64_t>(all.size());
  at::Tensor lo = ToComm({count}, comm);
  at::Tensor hi = lo.clone();
  RETURN_IF_ERROR(comm.AllReduce(lo, ReduceOp::kMin, tag + "/count")->Wait(deadline));
  RETURN_IF_ERROR(comm.AllReduce(hi, ReduceOp::kMax, tag + "/count")->Wait(deadline));
  if (lo.item<int64_t>() != hi.item<int64_t>()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ranks wrap different numbers of parameters and buffers (",
                     lo.item<int64_t>(), " to ", hi.item<int64_t>(), "); this rank has ", count,
                     ". Build the same model on every rank."));
  }
  if (count == 0) return absl::OkStatus();
  std::vector<int64_t> hashes(count);
  for (int64_t i = 0; i < count; ++i) hashes[i] = StableHash(Describe(all[i]));
  at::Tensor min_h = ToComm(hashes, comm);
  at::Tensor max_h = min_h.clone();
  RETURN_IF_ERROR(comm.AllReduce(min_h, ReduceOp::kMin, tag + "/params")->Wait(deadline));
  RETURN_IF_ERROR(comm.AllReduce(max_h, ReduceOp::kMax, tag + "/params")->Wait(deadline));
  const std::vector<int64_t> lows = FromComm(min_h);
  const std::vector<int64_t> highs = FromComm(max_h);
  const auto differs = std::mismatch(lows.begin(), lows.end(), highs.begin());
  if (differs.first != lows.end()) {
    const int64_t i = differs.first - lows.begin();
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": parameter/buffer #", i,
        " differs across ranks (name, dtype, shape or requires_grad); on this rank it is ",
        Describe(all[i]), ". Build the same model on every rank."));
  }
  return absl::OkStatus();
}

absl::Status BroadcastCoalesced(const std::vector<at::Tensor>& tensors, int root,
                                Communicator& comm, const std::string& tag, absl::Time deadline) {
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : group) flat_parts.push_back(t.detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    RETURN_IF_ERROR(comm.Broadcast(flat, root, tag)->Wait(deadline));
    int64_t offset = 0;
    for (const at::Tensor& t : group) {
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

absl::Status BroadcastIndices(std::vector<size_t>& values, int root, Communicator& comm,
                              const std::string& tag, absl::Time deadline) {
  at::Tensor t = ToComm(std::vector<int64_t>(values.begin(), values.end()), comm);
  RETURN_IF_ERROR(comm.Broadcast(t, root, tag)->Wait(deadline));
  const std::vector<int64_t> got = FromComm(t);
  values.assign(got.begin(), got.end());
  return absl::OkStatus();
}

}  // namespace chorus
