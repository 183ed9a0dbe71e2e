#include "chorus/elastic.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

// The members' lists must agree; a checksum of names, shapes and dtypes
// (FNV-1a) is what they compare.
int64_t ListChecksum(const std::vector<NamedTensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator
  };
  for (const NamedTensor& t : tensors) {
    mix(t.name);
    mix(DtypeName(t.tensor.scalar_type()));
    for (int64_t d : t.tensor.sizes()) mix(std::to_string(d));
  }
  // Kept in 62 bits so that its negation fits too.
  return static_cast<int64_t>(h >> 2);
}

// The tensors of one dtype and device, broadcast or reduced as one buffer.
using Groups = std::map<std::pair<at::ScalarType, std::string>, std::vector<at::Tensor>>;

Groups GroupTensors(const std::vector<NamedTensor>& tensors, bool floating_only) {
  Groups groups;
  for (const NamedTensor& t : tensors) {
    if (floating_only && !at::isFloatingType(t.tensor.scalar_type())) continue;
    groups[{t.tensor.scalar_type(), t.tensor.device().str()}].push_back(t.tensor);
  }
  return groups;
}

at::Tensor Flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& t : tensors) flat.push_back(t.detach().reshape({-1}));
  return torch::cat(flat);
}

void Unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& into) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : into) {
    t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

// One all-reduce (max) that finds the newest step, the lowest rank holding
// it, and whether the lists agree: (step + 1) << 20 | (2^20 - 1 - rank)
// orders by step, then by lowest rank; the checksum and its negation give
// its maximum and minimum.
struct Agreement {
  int64_t step = -1;
  int source = 0;
  bool lists_agree = true;
};

absl::StatusOr<Agreement> Agree(Communicator& comm, int64_t held_step, int64_t checksum,
                                absl::string_view tag, absl::Time deadline) {
  constexpr int kRankBits = 20;
  if (comm.size() >= (1 << kRankBits)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state sharing supports up to ", (1 << kRankBits) - 1, " ranks"));
  }
  const int64_t step = std::max<int64_t>(held_step, -1);
  at::Tensor v =
      torch::tensor({((step + 1) << kRankBits) | ((int64_t{1} << kRankBits) - 1 - comm.rank()),
                     checksum, -checksum},
                    torch::kLong);
  RETURN_IF_ERROR(comm.AllReduce(v, ReduceOp::kMax, tag)->Wait(deadline));
  const int64_t key = v[0].item<int64_t>();
  Agreement a;
  a.step = (key >> kRankBits) - 1;
  a.source = static_cast<int>((int64_t{1} << kRankBits) - 1 - (key & ((1 << kRankBits) - 1)));
  a.lists_agree = v[1].item<int64_t>() == -v[2].item<int64_t>();
  return a;
}

absl::Status ListsDiffer(const Communicator& comm, size_t count) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the ", comm.size(), " ranks passed different tensor lists (this rank ", comm.rank(),
      " passed ", count,
      "): every member must pass the same names, shapes and dtypes in the same order"));
}

}  // namespace

bool IsMembershipLost(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) || absl::IsDeadlineExceeded(status);
}

absl::StatusOr<SharedTensors> ShareNewestTensors(Communicator& comm, int64_t held_step,
                                                 const std::vector<NamedTensor>& tensors,
                                                 absl::Time deadline) {
  ASSIGN_OR_RETURN(Agreement agreed,
                   Agree(comm, held_step, ListChecksum(tensors), "elastic/newest_state", deadline));
  if (!agreed.lists_agree) return ListsDiffer(comm, tensors.size());
  SharedTensors shared;
  shared.step = agreed.step;
  shared.source = agreed.source;
  for (auto& [key, group] : GroupTensors(tensors, /*floating_only=*/false)) {
    at::Tensor flat;
    if (comm.rank() == shared.source) {
      flat = Flatten(group);
    } else {
      int64_t n = 0;
      for (const at::Tensor& t : group) n += t.numel();
      flat = torch::empty({n}, group.front().options().requires_grad(false));
    }
    RETURN_IF_ERROR(
        comm.Broadcast(flat, shared.source, absl::StrCat("elastic/state/", DtypeName(key.first)))
            ->Wait(deadline));
    shared.bytes += flat.numel() * flat.element_size();
    if (comm.rank() != shared.source) Unflatten(flat, group);
  }
  return shared;
}

absl::StatusOr<int> AverageHeldTensors(Communicator& comm, bool held,
                                       const std::vector<NamedTensor>& tensors,
                                       absl::Time deadline) {
  ASSIGN_OR_RETURN(Agreement agreed, Agree(comm, held ? 0 : -1, ListChecksum(tensors),
                                           "elastic/held_models", deadline));
  if (!agreed.lists_agree) return ListsDiffer(comm, tensors.size());
  at::Tensor count = torch::full({1}, held ? 1 : 0, torch::kLong);
  RETURN_IF_ERROR(comm.AllReduce(count, ReduceOp::kSum, "elastic/held_count")->Wait(deadline));
  const int64_t holders = count.item<int64_t>();
  if (holders == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "none of the ", comm.size(), " ranks holds a model to average (every survivor was lost)"));
  }
  for (auto& [key, group] : GroupTensors(tensors, /*floating_only=*/true)) {
    at::Tensor sum = Flatten(group).to(torch::kDouble);
    if (!held) sum.zero_();
    RETURN_IF_ERROR(
        comm.AllReduce(sum, ReduceOp::kSum, absl::StrCat("elastic/mean/", DtypeName(key.first)))
            ->Wait(deadline));
    Unflatten(sum.div_(static_cast<double>(holders)).to(key.first), group);
  }
  return static_cast<int>(holders);
}

}  // namespace chorus
