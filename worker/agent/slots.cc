#include "worker/agent/slots.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_binding.h"
#include "common/device.h"

namespace chorus {

SlotFacts SlotFacts::OfThisMachine() {
  SlotFacts facts;
  facts.online_cpus = OnlineCpus();
  facts.gpu_count = [] { return CudaDeviceCount(); };
  return facts;
}

int OnlineCpus() {
  if (const size_t count = AllowedCpus().size(); count > 0) return static_cast<int>(count);
  long configured = sysconf(_SC_NPROCESSORS_ONLN);
  return configured > 0 ? static_cast<int>(configured) : 1;
}

absl::StatusOr<int> ResolveSlots(const std::string& flag, v1::ResourceSpec::Device device,
                                 int threads_per_slot, const SlotFacts& facts) {
  if (flag != "auto") {
    int slots = 0;
    if (!absl::SimpleAtoi(flag, &slots) || slots < 1 || slots > kMaxSlots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slots must be `auto` or a whole number in [1, ", kMaxSlots, "], got \"", flag, "\""));
    }
    return slots;
  }
  if (device == v1::ResourceSpec::CUDA) {
    absl::StatusOr<int> gpus =
        facts.gpu_count ? facts.gpu_count()
                        : absl::StatusOr<int>(absl::FailedPreconditionError("no GPU probe"));
    if (!gpus.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--slots auto --device cuda counts GPUs, but ", gpus.status().message()));
    }
    if (*gpus < 1) {
      return absl::FailedPreconditionError(
          "--slots auto --device cuda: CUDA sees no GPU on this machine; check the driver "
          "(nvidia-smi) and CUDA_VISIBLE_DEVICES, or run with --device cpu");
    }
    return std::min(*gpus, kMaxSlots);
  }
  if (threads_per_slot < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads_per_slot must be >= 1, got ", threads_per_slot));
  }
  return std::clamp(facts.online_cpus / threads_per_slot, 1, kMaxSlots);
}

}  // namespace chorus
