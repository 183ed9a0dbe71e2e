#include "common/cpu_pressure.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cpu_binding.h"
#include "common/paths.h"

namespace chorus {

std::optional<double> ParsePsiCpuSome(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "some ")) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      double percent = 0;
      if (absl::ConsumePrefix(&field, "avg10=") && absl::SimpleAtod(field, &percent)) {
        return std::clamp(percent / 100.0, 0.0, 1.0);
      }
    }
  }
  return std::nullopt;
}

double PressureFromLoad(double load, int cpus) {
  if (cpus < 1 || load <= cpus) return 0;
  return 1.0 - cpus / load;
}

double NodeCpuPressure(const std::string& proc) {
  if (std::optional<std::string> psi = ReadSmallFile(proc + "/pressure/cpu")) {
    if (std::optional<double> some = ParsePsiCpuSome(*psi)) return *some;
  }
  std::optional<std::string> loadavg = ReadSmallFile(proc + "/loadavg");
  if (!loadavg.has_value()) return 0;
  const std::vector<absl::string_view> fields = absl::StrSplit(*loadavg, ' ', absl::SkipEmpty());
  double load = 0;
  if (fields.empty() || !absl::SimpleAtod(fields[0], &load)) return 0;
  return PressureFromLoad(load, static_cast<int>(AllowedCpus().size()));
}

}  // namespace chorus
