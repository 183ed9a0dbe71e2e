#include "chorus/data_parallel.h"

#include <torch/nn/module.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace chorus {
namespace {

bool Selected(const std::string& name, const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return true;
  for (const std::string& p : prefixes) {
    if (absl::StartsWith(name, p)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<NamedTensor>> NamedParameters(torch::nn::Module& module,
                                                         const std::vector<std::string>& prefixes) {
  std::vector<NamedTensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (Selected(item.key(), prefixes)) out.push_back({item.key(), item.value()});
  }
  for (const std::string& p : prefixes) {
    bool matched = false;
    for (const NamedTensor& t : out) matched = matched || absl::StartsWith(t.name, p);
    if (!matched) {
      std::string names;
      for (const auto& item : module.named_parameters(/*recurse=*/true)) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", item.key());
        if (names.size() > 200) {
          absl::StrAppend(&names, ", ...");
          break;
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("parameter prefix '", p, "' matches no parameter of the module (it has ",
                       names.empty() ? "none" : names, ")"));
    }
  }
  return WithoutRepeatedTensors(std::move(out));
}

std::vector<NamedTensor> NamedBuffers(torch::nn::Module& module,
                                      const std::vector<std::string>& prefixes) {
  std::vector<NamedTensor> out;
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (Selected(item.key(), prefixes)) out.push_back({item.key(), item.value()});
  }
  return WithoutRepeatedTensors(std::move(out));
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallelFor(
    torch::nn::Module& module, const std::vector<std::string>& prefixes, Communicator& comm,
    DdpOptions options) {
  ASSIGN_OR_RETURN(std::vector<NamedTensor> params, NamedParameters(module, prefixes));
  return DistributedDataParallel::Create(std::move(params), NamedBuffers(module, prefixes), comm,
                                         std::move(options));
}

absl::StatusOr<std::unique_ptr<DecentralizedDataParallel>> DecentralizedDataParallelFor(
    torch::nn::Module& module, const std::vector<std::string>& prefixes, Communicator& comm,
    OptimizerFactory make_optimizer, LrSchedule lr_schedule, DecentralizedOptions options) {
  ASSIGN_OR_RETURN(std::vector<NamedTensor> params, NamedParameters(module, prefixes));
  return DecentralizedDataParallel::Create(std::move(params), NamedBuffers(module, prefixes), comm,
                                           std::move(make_optimizer), std::move(lr_schedule),
                                           std::move(options));
}

}  // namespace chorus
