#include "checkpoint/layout.h"

#include "absl/strings/str_cat.h"

namespace chorus {

std::string ModelFileName(int rank) {
  return rank == 0 ? kModelFile : absl::StrCat("model.rank", rank, ".pt");
}

std::string TrainStateFileName(int rank) {
  return rank == 0 ? kTrainStateFile : absl::StrCat("train_state.rank", rank, ".pt");
}

}  // namespace chorus
