#include "chorus/communicator.h"

#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace chorus {

at::Tensor Communicator::NewBuffer(int64_t numel, const at::TensorOptions& options) {
  return at::empty({numel}, options);
}

c10::Device Communicator::device() const { return c10::Device(c10::kCPU); }

void Work::WhenDone(std::function<void(const absl::Status&)> callback) {
  callback(Wait(absl::InfiniteFuture()));
}

namespace {

// An op that failed before it was issued.
class RefusedWork final : public Work {
 public:
  explicit RefusedWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait(absl::Time) override { return status_; }
  bool Done() const override { return true; }
  int64_t seq() const override { return 0; }

 private:
  const absl::Status status_;
};

}  // namespace

std::shared_ptr<Work> Communicator::ReduceScatter(at::Tensor, at::Tensor, ReduceOp,
                                                  absl::string_view) {
  return std::make_shared<RefusedWork>(
      absl::UnimplementedError("ReduceScatter is not implemented by this communicator"));
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kBand:
      return "band";
    case ReduceOp::kBor:
      return "bor";
    case ReduceOp::kBxor:
      return "bxor";
  }
  return "unknown";
}

std::string DtypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kByte:
      return "uint8";
    case at::kChar:
      return "int8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

absl::StatusOr<int> GroupIndexOf(const std::vector<int>& ranks, int size, int rank) {
  if (ranks.empty()) return absl::InvalidArgumentError("NewGroup: ranks must not be empty");
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewGroup: ranks must be sorted, unique and in [0, ", size, "), got [",
                       absl::StrJoin(ranks, ","), "]"));
    }
    if (ranks[i] == rank) index = static_cast<int>(i);
  }
  if (index < 0) {
    return absl::NotFoundError(
        absl::StrCat("NewGroup: rank ", rank, " is not in [", absl::StrJoin(ranks, ","), "]"));
  }
  return index;
}

std::vector<int> WorldRanks(const std::vector<int>& ranks, const std::vector<int>& parent_group) {
  std::vector<int> world;
  for (int r : ranks) world.push_back(parent_group.empty() ? r : parent_group[r]);
  return world;
}

}  // namespace chorus
