// The model a job trains, built from its ModelSpec: the built-in mlp, cnn and
// transformer_lm, or a TorchScript module loaded from a file.
//
// Not thread-safe; one training thread owns a Model. WithSeed may be called
// from any thread.
//
// Example:
//   absl::StatusOr<std::unique_ptr<Model>> model;
//   WithSeed(seed, [&] { model = Model::Build(spec.model(), train); });
//   at::Tensor logits = (*model)->Forward(batch_x);
#ifndef CHORUS_WORKER_TRAIN_MODEL_H_
#define CHORUS_WORKER_TRAIN_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "chorus/named_tensor.h"
#include "chorus/v1/job.pb.h"
#include "worker/train/data.h"

namespace chorus {

class Model {
 public:
  // Builds the model `spec` describes for inputs shaped like `train`'s
  // samples. INVALID_ARGUMENT when the data does not fit the model (e.g. a cnn
  // on flat vectors) or a TorchScript file cannot be loaded (naming the path).
  // Initialization draws from the process's default generator: call it
  // inside WithSeed for parameters that are a function of the seed.
  static absl::StatusOr<std::unique_ptr<Model>> Build(const v1::ModelSpec& spec,
                                                      const Dataset& train);

  virtual ~Model() = default;

  // Output for a batch: [B, classes] logits, [B, T, vocab] for token models,
  // or whatever a TorchScript module's forward returns (it must be a tensor).
  virtual absl::StatusOr<at::Tensor> Forward(const at::Tensor& input) = 0;
  // Parameters and buffers with their dotted names, in registration order,
  // each tensor once: one that submodules share (tied weights) under its
  // first name, as PyTorch's named_parameters() lists it.
  virtual std::vector<NamedTensor> NamedParameters() = 0;
  virtual std::vector<NamedTensor> NamedBuffers() = 0;
  // Every entry of the model's state dict as PyTorch's state_dict() lists
  // it: a tensor that submodules share (tied weights) under each of its
  // names, so that load_state_dict() of an exported file finds them all.
  // Checkpoints store these names (model.pt). The default: NamedParameters()
  // then NamedBuffers().
  virtual std::vector<NamedTensor> StateDictEntries();
  // Training mode (dropout on) or evaluation mode.
  virtual void SetTraining(bool training) = 0;
  // Moves parameters and buffers to `device` in place: the tensors
  // NamedParameters() returns keep their identity (tied weights stay tied),
  // only their memory moves. Call before an optimizer or engine holds them.
  // The default moves each tensor of NamedParameters() and NamedBuffers().
  virtual void To(const c10::Device& device);

  std::vector<at::Tensor> Parameters();
};

// Seeds the process's default generators (CPU and GPUs, torch::manual_seed)
// with `seed` and runs `draws`, while no other WithSeed call of this process
// runs (Note [Seeded draws]). `draws` must not wait for another rank.
void WithSeed(uint64_t seed, absl::FunctionRef<void()> draws);

// Note [Seeded draws]
// LibTorch has one default generator per process (and one per GPU), and
// torch::nn draws initial parameters and dropout masks from it. A rank seeds
// it and then draws, so that what it draws is a function of the seed (and of
// step and micro-batch number for dropout: the trainer's SeededForward). Ranks that are threads of one process (the
// trainer's tests, anything that runs Train on several threads) share that
// generator: when one rank re-seeds it or draws between another's seed and
// that rank's draws, the other draws from a state that depends on thread
// timing. Rank 0's initial model, which every rank starts from, then
// changed with the load of the machine, and so did the whole run (two
// identical gossip runs ended at eval loss 0.0615 and 0.0706). Every
// seed-then-draw of the trainer therefore goes through WithSeed, which holds
// one process-wide lock from the seed to the last draw; a rank process
// of its own never waits on it.

}  // namespace chorus

#endif  // CHORUS_WORKER_TRAIN_MODEL_H_
