#include "python/process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "chorus/progress.h"

namespace chorus {
namespace {

// c10d reports errors by throwing; its Python binding turns them into
// RuntimeError with this message.
[[noreturn]] void Refuse(const std::string& message) {
  throw std::invalid_argument(absl::StrCat("chorus backend: ", message));
}

void CheckOne(const std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    Refuse(absl::StrCat(op, " takes one tensor per process (a rank owns one device); got ",
                        tensors.size()));
  }
}

void CheckContiguous(const at::Tensor& t, const char* op) {
  if (!t.is_contiguous()) {
    Refuse(absl::StrCat(op, " needs a contiguous tensor (call .contiguous() first)"));
  }
}

void CheckList(const std::vector<at::Tensor>& list, const at::Tensor& like, int size,
               const char* op) {
  if (static_cast<int>(list.size()) != size) {
    Refuse(absl::StrCat(op, " needs one tensor per rank (", size, "); got ", list.size()));
  }
  for (const at::Tensor& t : list) {
    if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
      Refuse(absl::StrCat(op, ": every tensor of the list must have the size and dtype of the ",
                          "input (", like.numel(), " elements of ", DtypeName(like.scalar_type()),
                          ")"));
    }
  }
}

[[noreturn]] void Unsupported(const char* op, const char* instead) {
  Refuse(absl::StrCat(op, " is not supported; ", instead));
}

// The flat buffer a list of per-rank tensors is laid out in.
at::Tensor Flat(const at::Tensor& like, int size) {
  return at::empty({size * like.numel()}, like.options());
}

// Copies slice `index` of `flat` (`into`'s size) into `into`.
void CopySlice(const at::Tensor& flat, int64_t index, at::Tensor& into) {
  const int64_t n = into.numel();
  into.copy_(flat.narrow(0, index * n, n).view(into.sizes()));
}

std::vector<c10::Device> CudaDevices(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const at::Tensor& t : tensors) {
    if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

}  // namespace

absl::StatusOr<ReduceOp> ToChorusReduceOp(const c10d::ReduceOp& op, const char* collective) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    case c10d::ReduceOp::PRODUCT:
      return absl::InvalidArgumentError(absl::StrCat(
          collective,
          " with ReduceOp.PRODUCT is not supported; use SUM, AVG, MIN, MAX, BAND, BOR or BXOR"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          collective, " with ReduceOp ", static_cast<int>(op.op_),
          " (a pre-multiplied sum) is not supported; use SUM, AVG, MIN, MAX, BAND, BOR or BXOR"));
  }
}

namespace {

ReduceOp ReduceOrRefuse(const c10d::ReduceOp& op, const char* collective) {
  absl::StatusOr<ReduceOp> chorus_op = ToChorusReduceOp(op, collective);
  if (!chorus_op.ok()) Refuse(std::string(chorus_op.status().message()));
  return *chorus_op;
}

}  // namespace

CommunicatorWork::CommunicatorWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                                   ProgressReporter* progress)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      progress_(progress),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), CudaDevices(outputs_))) {}

bool CommunicatorWork::wait(std::chrono::milliseconds timeout) {
  std::optional<PhaseScope> waiting;
  if (progress_ != nullptr) waiting.emplace(*progress_, v1::COLLECTIVE);
  return c10d::Work::wait(timeout);
}

void CommunicatorWork::Complete(const absl::Status& status) {
  // The Future first: a caller that returns from wait() may read it at once.
  if (status.ok()) {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
    return;
  }
  std::exception_ptr error = std::make_exception_ptr(std::runtime_error(status.ToString()));
  future_->setError(error);
  finish(error);
}

CommunicatorProcessGroup::CommunicatorProcessGroup(std::shared_ptr<Communicator> comm,
                                                   ProgressReporter* progress,
                                                   std::shared_ptr<const void> owner,
                                                   absl::Duration exit_grace)
    : c10d::ProcessGroup(comm->rank(), comm->size()),
      comm_(std::move(comm)),
      progress_(progress),
      owner_(std::move(owner)),
      exit_grace_(exit_grace),
      completions_(std::make_shared<Completions>()),
      completer_([this] { CompleteAsFinished(); }) {}

CommunicatorProcessGroup::~CommunicatorProcessGroup() {
  if (!AwaitAllCompleted(exit_grace_)) {
    size_t running = 0;
    {
      absl::MutexLock lock(&completions_->mu);
      running = completions_->unfinished;
    }
    comm_->Abort(absl::StrCat("the chorus process group was destroyed with ", running,
                              " op(s) still running after ",
                              absl::FormatDuration(exit_grace_)));
    // Aborting finishes every op (failed); their Works complete with that.
    if (!AwaitAllCompleted(exit_grace_)) {
      LOG(WARNING) << "chorus process group: ops still unfinished after the communicator was "
                      "aborted; their Works are left incomplete";
    }
  }
  {
    absl::MutexLock lock(&completions_->mu);
    completions_->stopping = true;
  }
  completer_.join();
}

bool CommunicatorProcessGroup::AwaitAllCompleted(absl::Duration timeout) {
  Completions& c = *completions_;
  absl::MutexLock lock(&c.mu);
  auto idle = [&c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) { return c.unfinished == 0; };
  return c.mu.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

uint64_t CommunicatorProcessGroup::getSequenceNumberForGroup() { return issued_.load(); }

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::Track(std::shared_ptr<Work> op,
                                                               c10d::OpType type,
                                                               std::vector<at::Tensor> outputs,
                                                               std::function<void()> after) {
  auto work = c10::make_intrusive<CommunicatorWork>(getRank(), type, std::move(outputs), progress_);
  ++issued_;
  {
    absl::MutexLock lock(&completions_->mu);
    ++completions_->unfinished;
  }
  // Runs on the thread that finished the op: hand it over, keep nothing
  // (Note [Tensors die on Python's terms]).
  op->WhenDone([c = completions_, work, after = std::move(after)](
                   const absl::Status& status) mutable {
    absl::MutexLock lock(&c->mu);
    c->finished.push_back(Finished{std::move(work), std::move(after), status});
  });
  return work;
}

// Finishes each op's c10d Work in the order the ops finished.
void CommunicatorProcessGroup::CompleteAsFinished() {
  Completions& c = *completions_;
  for (;;) {
    Finished next;
    {
      absl::MutexLock lock(&c.mu);
      auto ready = [&c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) {
        return c.stopping || !c.finished.empty();
      };
      c.mu.Await(absl::Condition(&ready));
      if (c.finished.empty()) return;  // stopping, nothing left
      next = std::move(c.finished.front());
      c.finished.pop_front();
    }
    absl::Status status = next.status;
    if (status.ok() && next.after) {
      try {
        next.after();
      } catch (const std::exception& e) {
        status = absl::InternalError(absl::StrCat("copying the result out: ", e.what()));
      }
    }
    next.work->Complete(status);
    next = Finished();  // before the op counts as completed
    absl::MutexLock lock(&c.mu);
    --c.unfinished;
  }
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  CheckOne(tensors, "broadcast");
  CheckContiguous(tensors[0], "broadcast");
  return Track(comm_->Broadcast(tensors[0], static_cast<int>(opts.rootRank), "torch:broadcast"),
               c10d::OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  CheckOne(tensors, "all_reduce");
  CheckContiguous(tensors[0], "all_reduce");
  ReduceOp op = ReduceOrRefuse(opts.reduceOp, "all_reduce");
  return Track(comm_->AllReduce(tensors[0], op, "torch:all_reduce"), c10d::OpType::ALLREDUCE,
               tensors);
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&) {
  Unsupported("all_reduce_coalesced", "all-reduce the tensors one by one or flattened into one");
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  CheckOne(tensors, "reduce");
  CheckContiguous(tensors[0], "reduce");
  ReduceOp op = ReduceOrRefuse(opts.reduceOp, "reduce");
  // The root's tensor takes the result; the others stay as they were.
  at::Tensor target = opts.rootRank == getRank() ? tensors[0] : tensors[0].clone();
  return Track(comm_->AllReduce(target, op, "torch:reduce"), c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  CheckOne(inputs, "all_gather");
  if (outputs.size() != 1) Refuse("all_gather takes one output list per process");
  at::Tensor input = inputs[0].contiguous();
  CheckList(outputs[0], input, getSize(), "all_gather");
  at::Tensor flat = Flat(input, getSize());
  std::vector<at::Tensor> list = outputs[0];
  return Track(comm_->AllGather(input, flat, "torch:all_gather"), c10d::OpType::ALLGATHER, list,
               [flat, list]() mutable {
                 for (size_t r = 0; r < list.size(); ++r) CopySlice(flat, r, list[r]);
               });
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  CheckContiguous(output, "all_gather_into_tensor");
  if (output.numel() != getSize() * input.numel() ||
      output.scalar_type() != input.scalar_type()) {
    Refuse(absl::StrCat("all_gather_into_tensor needs an output of world size x input elements (",
                        getSize() * input.numel(), ") and the input's dtype"));
  }
  return Track(comm_->AllGather(input.contiguous(), output.view({-1}), "torch:all_gather"),
               c10d::OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
    const c10d::AllgatherOptions&) {
  Unsupported("all_gather_coalesced", "all-gather the tensors one by one");
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  CheckOne(inputs, "gather");
  at::Tensor input = inputs[0].contiguous();
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> list;
  if (root) {
    if (outputs.size() != 1) Refuse("gather: the root takes one output list");
    list = outputs[0];
    CheckList(list, input, getSize(), "gather");
  } else if (!outputs.empty() && !outputs[0].empty()) {
    Refuse(absl::StrCat("gather: only the root (rank ", opts.rootRank,
                        ") passes an output list"));
  }
  at::Tensor flat = Flat(input, getSize());
  return Track(comm_->AllGather(input, flat, "torch:gather"), c10d::OpType::GATHER, list,
               [flat, list]() mutable {
                 for (size_t r = 0; r < list.size(); ++r) CopySlice(flat, r, list[r]);
               });
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  CheckOne(outputs, "scatter");
  at::Tensor output = outputs[0];
  const bool root = opts.rootRank == getRank();
  at::Tensor flat = Flat(output, getSize());
  if (root) {
    if (inputs.size() != 1) Refuse("scatter: the root takes one input list");
    CheckList(inputs[0], output, getSize(), "scatter");
    for (int r = 0; r < getSize(); ++r) {
      flat.narrow(0, r * output.numel(), output.numel()).copy_(inputs[0][r].reshape({-1}));
    }
  } else if (!inputs.empty() && !inputs[0].empty()) {
    Refuse(absl::StrCat("scatter: only the root (rank ", opts.rootRank, ") passes an input list"));
  }
  const int rank = getRank();
  return Track(comm_->Broadcast(flat, static_cast<int>(opts.rootRank), "torch:scatter"),
               c10d::OpType::SCATTER, outputs,
               [flat, output, rank]() mutable { CopySlice(flat, rank, output); });
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  CheckOne(outputs, "reduce_scatter");
  if (inputs.size() != 1) Refuse("reduce_scatter takes one input list per process");
  at::Tensor output = outputs[0];
  CheckList(inputs[0], output, getSize(), "reduce_scatter");
  ReduceOp op = ReduceOrRefuse(opts.reduceOp, "reduce_scatter");
  at::Tensor flat = Flat(output, getSize());
  for (int r = 0; r < getSize(); ++r) {
    flat.narrow(0, r * output.numel(), output.numel()).copy_(inputs[0][r].reshape({-1}));
  }
  return Track(comm_->ReduceScatter(flat, output, op, "torch:reduce_scatter"),
               c10d::OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  if (input.numel() != getSize() * output.numel() ||
      output.scalar_type() != input.scalar_type()) {
    Refuse(absl::StrCat("reduce_scatter_tensor needs an input of world size x output elements (",
                        getSize() * output.numel(), ") and the output's dtype"));
  }
  ReduceOp op = ReduceOrRefuse(opts.reduceOp, "reduce_scatter_tensor");
  return Track(comm_->ReduceScatter(input.contiguous(), output, op, "torch:reduce_scatter"),
               c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

namespace {

// A Work that finishes when every one of `parts` has: with OK, or with the
// first failure of one of them.
class AllOfWork final : public Work {
 public:
  explicit AllOfWork(std::vector<std::shared_ptr<Work>> parts)
      : parts_(std::move(parts)), state_(std::make_shared<State>()) {
    state_->remaining = parts_.size();
    for (const std::shared_ptr<Work>& part : parts_) {
      part->WhenDone([state = state_](const absl::Status& s) { state->PartDone(s); });
    }
  }

  absl::Status Wait(absl::Time deadline) override {
    absl::MutexLock lock(&state_->mu);
    auto done = [s = state_.get()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return s->remaining == 0;
    };
    if (!state_->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          state_->remaining, " of the ", parts_.size(), " parts of an exchange have not finished"));
    }
    return state_->status;
  }
  bool Done() const override {
    absl::MutexLock lock(&state_->mu);
    return state_->remaining == 0;
  }
  int64_t seq() const override { return parts_.empty() ? -1 : parts_.front()->seq(); }
  void WhenDone(std::function<void(const absl::Status&)> callback) override {
    absl::Status status;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->remaining > 0) {
        state_->callbacks.push_back(std::move(callback));
        return;
      }
      status = state_->status;
    }
    callback(status);
  }

 private:
  struct State {
    absl::Mutex mu;
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
    std::vector<std::function<void(const absl::Status&)>> callbacks ABSL_GUARDED_BY(mu);

    void PartDone(const absl::Status& s) {
      std::vector<std::function<void(const absl::Status&)>> ready;
      absl::Status final_status;
      {
        absl::MutexLock lock(&mu);
        if (!s.ok() && status.ok()) status = s;
        if (--remaining > 0) return;
        ready.swap(callbacks);
        final_status = status;
      }
      for (auto& callback : ready) callback(final_status);
    }
  };

  const std::vector<std::shared_ptr<Work>> parts_;
  const std::shared_ptr<State> state_;
};

// Where each rank's part of a tensor split along dimension 0 starts and how
// many rows it has: `splits` as given, or equal parts when it is empty.
std::vector<std::pair<int64_t, int64_t>> Parts(const at::Tensor& t, std::vector<int64_t> splits,
                                               int size, const char* which) {
  if (t.dim() == 0) Refuse(absl::StrCat("all_to_all_single: the ", which, " is a scalar"));
  const int64_t rows = t.size(0);
  if (splits.empty()) {
    if (rows % size != 0) {
      Refuse(absl::StrCat("all_to_all_single: the ", which, "'s dimension 0 (", rows,
                          ") does not divide into ", size, " equal parts; pass ", which,
                          "_split_sizes"));
    }
    splits.assign(size, rows / size);
  }
  if (static_cast<int>(splits.size()) != size) {
    Refuse(absl::StrCat("all_to_all_single: ", which, "_split_sizes has ", splits.size(),
                        " entries; it needs one per rank (", size, ")"));
  }
  std::vector<std::pair<int64_t, int64_t>> parts;
  int64_t at = 0;
  for (int64_t n : splits) {
    if (n < 0) Refuse(absl::StrCat("all_to_all_single: ", which, "_split_sizes has ", n));
    parts.emplace_back(at, n);
    at += n;
  }
  if (at != rows) {
    Refuse(absl::StrCat("all_to_all_single: ", which, "_split_sizes add up to ", at,
                        ", the ", which, " has ", rows, " rows along dimension 0"));
  }
  return parts;
}

}  // namespace

// Note [All-to-all as sends and receives]
// An all-to-all is a send of this rank's part to every other rank and a
// receive of theirs; its own part is copied. The sends and receives progress
// independently (Note [Point-to-point progress] in worker/comm/p2p_lanes.h)
// and pair per peer in issue order, so consecutive all-to-alls (a mixture of
// experts' dispatch and combine) meet part for part; parts of no rows are
// neither sent nor received, on both sides alike, since the splits of two
// ranks agree on them. The Work finishes when every part has arrived.
c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::Exchange(
    const std::vector<at::Tensor>& sends, const std::vector<at::Tensor>& receives,
    c10d::OpType type, std::vector<at::Tensor> outputs, std::function<void()> after) {
  const int rank = getRank();
  std::vector<std::shared_ptr<Work>> parts;
  for (int peer = 0; peer < getSize(); ++peer) {
    if (peer == rank || receives[peer].numel() == 0) continue;
    parts.push_back(comm_->Recv(receives[peer], peer, "torch:all_to_all"));
  }
  for (int peer = 0; peer < getSize(); ++peer) {
    if (peer == rank || sends[peer].numel() == 0) continue;
    parts.push_back(comm_->Send(sends[peer], peer, "torch:all_to_all"));
  }
  if (receives[rank].numel() != sends[rank].numel()) {
    Refuse(absl::StrCat("all_to_all: this rank's part for itself has ", sends[rank].numel(),
                        " elements in the input and room for ", receives[rank].numel(),
                        " in the output"));
  }
  receives[rank].view(-1).copy_(sends[rank].reshape(-1));
  return Track(std::make_shared<AllOfWork>(std::move(parts)), type, std::move(outputs),
               std::move(after));
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions&) {
  CheckContiguous(output, "all_to_all_single");
  if (output.scalar_type() != input.scalar_type()) {
    Refuse(absl::StrCat("all_to_all_single: the output is ", DtypeName(output.scalar_type()),
                        ", the input ", DtypeName(input.scalar_type()), "; they must match"));
  }
  at::Tensor in = input.contiguous();
  const auto in_parts = Parts(in, input_split_sizes, getSize(), "input");
  const auto out_parts = Parts(output, output_split_sizes, getSize(), "output");
  std::vector<at::Tensor> sends, receives;
  for (int p = 0; p < getSize(); ++p) {
    sends.push_back(in.narrow(0, in_parts[p].first, in_parts[p].second));
    receives.push_back(output.narrow(0, out_parts[p].first, out_parts[p].second));
  }
  return Exchange(sends, receives, c10d::OpType::ALLTOALL_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions&) {
  if (static_cast<int>(outputs.size()) != getSize() ||
      static_cast<int>(inputs.size()) != getSize()) {
    Refuse(absl::StrCat("all_to_all needs one input and one output tensor per rank (",
                        getSize(), "); got ", inputs.size(), " and ", outputs.size()));
  }
  std::vector<at::Tensor> sends, receives;
  for (int p = 0; p < getSize(); ++p) {
    if (outputs[p].scalar_type() != inputs[p].scalar_type()) {
      Refuse(absl::StrCat("all_to_all: output ", p, " is ", DtypeName(outputs[p].scalar_type()),
                          ", input ", p, " ", DtypeName(inputs[p].scalar_type())));
    }
    sends.push_back(inputs[p].contiguous());
    // A receive lands in a contiguous tensor, copied into a strided output.
    receives.push_back(outputs[p].is_contiguous() ? outputs[p] : at::empty_like(
                                                                      outputs[p],
                                                                      at::MemoryFormat::Contiguous));
  }
  std::function<void()> after;
  if (std::any_of(outputs.begin(), outputs.end(),
                  [](const at::Tensor& t) { return !t.is_contiguous(); })) {
    after = [outputs, receives]() mutable {
      for (size_t p = 0; p < outputs.size(); ++p) {
        if (!outputs[p].is_same(receives[p])) outputs[p].copy_(receives[p]);
      }
    };
  }
  return Exchange(sends, receives, c10d::OpType::ALLTOALL, outputs, std::move(after));
}

void CommunicatorProcessGroup::monitoredBarrier(const c10d::BarrierOptions&, bool) {
  Unsupported("monitored_barrier",
              "use barrier(): the coordinator names a rank that does not reach it "
              "(`chorus status`)");
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::send(std::vector<at::Tensor>& tensors,
                                                              int dst_rank, int) {
  CheckOne(tensors, "send");
  CheckContiguous(tensors[0], "send");
  return Track(comm_->Send(tensors[0], dst_rank, "torch:send"), c10d::OpType::SEND, tensors);
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::recv(std::vector<at::Tensor>& tensors,
                                                              int src_rank, int) {
  CheckOne(tensors, "recv");
  CheckContiguous(tensors[0], "recv");
  return Track(comm_->Recv(tensors[0], src_rank, "torch:recv"), c10d::OpType::RECV, tensors);
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::recvAnysource(std::vector<at::Tensor>&,
                                                                       int) {
  Unsupported("recv without a source rank", "pass src= (matching is per pair of ranks)");
}

c10::intrusive_ptr<c10d::Work> CommunicatorProcessGroup::barrier(const c10d::BarrierOptions&) {
  return Track(comm_->Barrier("torch:barrier"), c10d::OpType::BARRIER, {});
}

TorchStore::TorchStore(chorus::Store& store, std::shared_ptr<const void> owner)
    : store_(store), owner_(std::move(owner)) {}

namespace {

void ThrowIfError(const absl::Status& status, const char* op, const std::string& key) {
  if (!status.ok()) {
    throw std::runtime_error(absl::StrCat("chorus store: ", op, " '", key, "': ", status.ToString()));
  }
}

absl::Time DeadlineAfter(std::chrono::milliseconds timeout) {
  return timeout == c10d::Store::kNoTimeout
             ? absl::InfiniteFuture()
             : absl::Now() + absl::FromChrono(std::chrono::milliseconds(timeout));
}

}  // namespace

void TorchStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  ThrowIfError(store_.Set(key, std::string(value.begin(), value.end())), "set", key);
}

std::vector<uint8_t> TorchStore::compareSet(const std::string&, const std::vector<uint8_t>&,
                                            const std::vector<uint8_t>&) {
  Unsupported("the store's compare_set", "use set, get, add and wait");
}

std::vector<uint8_t> TorchStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_.Get(key, DeadlineAfter(timeout_));
  ThrowIfError(value.status(), "get", key);
  return std::vector<uint8_t>(value->begin(), value->end());
}

int64_t TorchStore::add(const std::string& key, int64_t value) {
  absl::StatusOr<int64_t> sum = store_.Add(key, value);
  ThrowIfError(sum.status(), "add", key);
  return *sum;
}

bool TorchStore::deleteKey(const std::string&) {
  Unsupported("the store's delete_key", "keys live as long as the generation");
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  absl::Status s = store_.Wait(keys, absl::Now());
  if (absl::IsDeadlineExceeded(s)) return false;
  ThrowIfError(s, "check", keys.empty() ? "" : keys.front());
  return true;
}

int64_t TorchStore::getNumKeys() {
  Unsupported("the store's num_keys", "count with add on a key of your own");
}

void TorchStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TorchStore::wait(const std::vector<std::string>& keys,
                      const std::chrono::milliseconds& timeout) {
  ThrowIfError(store_.Wait(keys, DeadlineAfter(timeout)), "wait", keys.empty() ? "" : keys.front());
}

}  // namespace chorus
