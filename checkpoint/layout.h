// What a checkpoint looks like on disk and on the wire: the names of its
// files. Every side uses these — the rank writes them, the coordinator's
// store records them, `chorus export` downloads one of them — so a file name
// is derived in exactly one place.
//
// A checkpoint is two files per part, each a dict of named tensors in the
// format of torch::pickle_save (worker/train/checkpoint.h says what they
// hold):
//   model.pt        parameters and buffers by name
//   train_state.pt  optimizer state and the training position
// With checkpoint.per_rank every rank writes its own pair: rank 0's under the
// names above, rank r's as model.rank<r>.pt and train_state.rank<r>.pt.
//
// Thread-safety: plain functions of their arguments.
//
// Example:
//   ModelFileName(0)       // "model.pt"
//   TrainStateFileName(3)  // "train_state.rank3.pt"
#ifndef CHORUS_CHECKPOINT_LAYOUT_H_
#define CHORUS_CHECKPOINT_LAYOUT_H_

#include <string>

namespace chorus {

inline constexpr char kModelFile[] = "model.pt";
inline constexpr char kTrainStateFile[] = "train_state.pt";

// The file names of rank `rank`'s part of a checkpoint (kModelFile and
// kTrainStateFile for rank 0).
// REQUIRES: rank >= 0.
std::string ModelFileName(int rank);
std::string TrainStateFileName(int rank);

}  // namespace chorus

#endif  // CHORUS_CHECKPOINT_LAYOUT_H_
