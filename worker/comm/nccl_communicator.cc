#include "worker/comm/nccl_communicator.h"

#include "absl/strings/str_cat.h"

#ifdef CHORUS_WITH_CUDA

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/comm/op_queue.h"

namespace chorus {
namespace {

// Thrown inside op bodies; the executor turns it into the Status it carries.
struct OpError {
  absl::Status status;
};

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": CUDA error: ", cudaGetErrorString(err)));
}

void ThrowIfCuda(cudaError_t err, absl::string_view what) {
  absl::Status s = CudaStatus(err, what);
  if (!s.ok()) throw OpError{s};
}

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL: dtype ", c10::toString(t), " is not supported"));
  }
}

class NcclCommunicator : public Communicator {
 public:
  static absl::StatusOr<std::shared_ptr<Communicator>> Create(const NcclOptions& options,
                                                              Store& store, std::vector<int> group,
                                                              std::unique_ptr<Store> owned) {
    if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL: rank ", options.rank, " is outside [0, ", options.size, ")"));
    }
    Store& s = owned ? *owned : store;
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device),
                               absl::StrCat("NCCL: cudaSetDevice(", options.device, ")")));
    ncclUniqueId id;
    if (options.rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        return absl::UnavailableError(
            absl::StrCat("NCCL: ncclGetUniqueId: ", ncclGetErrorString(r)));
      }
      RETURN_IF_ERROR(s.Set("nccl_unique_id", absl::string_view(id.internal, sizeof(id.internal))));
    } else {
      ASSIGN_OR_RETURN(std::string bytes,
                       s.Get("nccl_unique_id", absl::Now() + options.connect_timeout));
      if (bytes.size() != sizeof(id.internal)) {
        return absl::InternalError("NCCL: unique id in the store has the wrong size");
      }
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a stuck init can be aborted
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
    const absl::Time deadline = absl::Now() + options.connect_timeout;
    while (r == ncclInProgress) {
      if (absl::Now() > deadline) {
        ncclCommAbort(comm);
        return absl::DeadlineExceededError(absl::StrCat(
            "NCCL: rank ", options.rank, " of ", options.size, " could not initialise within ",
            absl::FormatDuration(options.connect_timeout)));
      }
      absl::SleepFor(absl::Milliseconds(1));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      return absl::UnavailableError(
          absl::StrCat("NCCL: init of rank ", options.rank, ": ", ncclGetErrorString(r)));
    }
    cudaStream_t stream = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                               "NCCL: cudaStreamCreate"));
    void* barrier = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&barrier, sizeof(float)), "NCCL: cudaMalloc"));
    return std::shared_ptr<Communicator>(new NcclCommunicator(options, s, comm, stream,
                                                              static_cast<float*>(barrier),
                                                              std::move(group), std::move(owned)));
  }

  ~NcclCommunicator() override {
    Abort("communicator destroyed");
    if (comm_ != nullptr) ncclCommAbort(comm_);
    cudaStreamDestroy(stream_);
    cudaFree(barrier_);
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  const std::vector<int>& group() const override { return group_; }
  const FlightRecorder& flight_recorder() const override { return recorder_; }
  c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(options_.device));
  }

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op, absl::string_view tag) override {
    if (absl::Status s = CheckTensor(tensor, "AllReduce"); !s.ok()) return QueuedWork::Failed(s);
    absl::StatusOr<ncclDataType_t> type = NcclType(tensor.scalar_type());
    if (!type.ok()) return QueuedWork::Failed(type.status());
    if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
      return QueuedWork::Failed(
          absl::InvalidArgumentError("AllReduce: avg needs a floating dtype"));
    }
    const ncclRedOp_t nccl_op = op == ReduceOp::kSum   ? ncclSum
                                : op == ReduceOp::kAvg ? ncclAvg
                                : op == ReduceOp::kMin ? ncclMin
                                                       : ncclMax;
    Fingerprint fp{absl::StrCat("allreduce/", ReduceOpName(op)), DtypeName(tensor.scalar_type()),
                   tensor.numel(), group_, std::string(tag)};
    const ncclDataType_t t = *type;
    return Launch(std::move(fp), true, [this, tensor, t, nccl_op] {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), t, nccl_op, comm_,
                           stream_);
    });
  }

  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root, absl::string_view tag) override {
    if (absl::Status s = CheckTensor(tensor, "Broadcast"); !s.ok()) return QueuedWork::Failed(s);
    if (root < 0 || root >= options_.size) {
      return QueuedWork::Failed(absl::InvalidArgumentError(
          absl::StrCat("Broadcast: root must be in [0, ", options_.size, "), got ", root)));
    }
    absl::StatusOr<ncclDataType_t> type = NcclType(tensor.scalar_type());
    if (!type.ok()) return QueuedWork::Failed(type.status());
    Fingerprint fp{absl::StrCat("broadcast/root", root), DtypeName(tensor.scalar_type()),
                   tensor.numel(), group_, std::string(tag)};
    const ncclDataType_t t = *type;
    return Launch(std::move(fp), true, [this, tensor, t, root] {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), t, root, comm_,
                           stream_);
    });
  }

  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output,
                                  absl::string_view tag) override {
    if (absl::Status s = CheckTensor(input, "AllGather input"); !s.ok())
      return QueuedWork::Failed(s);
    if (absl::Status s = CheckTensor(output, "AllGather output"); !s.ok())
      return QueuedWork::Failed(s);
    if (input.scalar_type() != output.scalar_type() ||
        output.numel() != input.numel() * options_.size) {
      return QueuedWork::Failed(absl::InvalidArgumentError(
          "AllGather: output must hold size() * input.numel() elements of input's dtype"));
    }
    absl::StatusOr<ncclDataType_t> type = NcclType(input.scalar_type());
    if (!type.ok()) return QueuedWork::Failed(type.status());
    Fingerprint fp{"allgather", DtypeName(input.scalar_type()), input.numel(), group_,
                   std::string(tag)};
    const ncclDataType_t t = *type;
    return Launch(std::move(fp), true, [this, input, output, t] {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), t, comm_, stream_);
    });
  }

  std::shared_ptr<Work> Barrier(absl::string_view tag) override {
    Fingerprint fp{"barrier", "", 0, group_, std::string(tag)};
    return Launch(std::move(fp), true, [this] {
      return ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  std::shared_ptr<Work> Send(at::Tensor tensor, int dst, absl::string_view tag) override {
    return P2p(tensor, dst, at::Tensor(), -1, tag, "send");
  }
  std::shared_ptr<Work> Recv(at::Tensor tensor, int src, absl::string_view tag) override {
    return P2p(at::Tensor(), -1, tensor, src, tag, "recv");
  }
  std::shared_ptr<Work> SendRecv(at::Tensor send, int dst, at::Tensor recv, int src,
                                 absl::string_view tag) override {
    return P2p(send, dst, recv, src, tag, "sendrecv");
  }

  absl::StatusOr<std::shared_ptr<Communicator>> NewGroup(std::vector<int> ranks) override {
    return groups_.GetOrCreate(
        ranks, options_.size, options_.rank, group_, store_,
        [this](int index, std::vector<int> world, std::unique_ptr<Store> store) {
          NcclOptions child = options_;
          child.rank = index;
          child.size = static_cast<int>(world.size());
          Store& ns = *store;
          return Create(child, ns, std::move(world), std::move(store));
        });
  }

  void Abort(absl::string_view reason) override {
    groups_.AbortAll(reason);
    // The op thread owns comm_ while an op runs: it sees the flag within a
    // poll interval and aborts the communicator itself.
    queue_->Shutdown(absl::AbortedError(absl::StrCat("communicator aborted: ", reason)),
                     [this] { abort_requested_.store(true); });
  }

 private:
  NcclCommunicator(const NcclOptions& options, Store& store, ncclComm_t comm, cudaStream_t stream,
                   float* barrier, std::vector<int> group, std::unique_ptr<Store> owned)
      : options_(options),
        owned_store_(std::move(owned)),
        store_(owned_store_ ? *owned_store_ : store),
        comm_(comm),
        stream_(stream),
        barrier_(barrier),
        group_(std::move(group)),
        recorder_(options.flight_recorder_capacity, options.clock),
        queue_(std::make_unique<OpQueue>(recorder_,
                                         [this](QueuedWork& work) { return Execute(work); })) {}

  absl::Status CheckTensor(const at::Tensor& t, absl::string_view what) const {
    if (!t.defined())
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor is undefined"));
    if (!t.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the NCCL backend takes CUDA tensors, got one on ", t.device().str(),
                       "; use the gloo backend for CPU tensors"));
    }
    if (!t.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the NCCL backend needs contiguous tensors; call .contiguous()"));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Work> P2p(at::Tensor send, int dst, at::Tensor recv, int src,
                            absl::string_view tag, absl::string_view op) {
    const bool has_send = op != "recv";
    const bool has_recv = op != "send";
    for (auto [peer, t, role] :
         {std::make_tuple(dst, &send, "dst"), std::make_tuple(src, &recv, "src")}) {
      const bool used = std::string(role) == "dst" ? has_send : has_recv;
      if (!used) continue;
      if (absl::Status s = CheckTensor(*t, op); !s.ok()) return QueuedWork::Failed(s);
      if (peer < 0 || peer >= options_.size || peer == options_.rank) {
        return QueuedWork::Failed(absl::InvalidArgumentError(absl::StrCat(
            op, ": ", role, " must be in [0, ", options_.size, ") and not this rank, got ", peer)));
      }
    }
    const at::Tensor& described = has_send ? send : recv;
    absl::StatusOr<ncclDataType_t> type = NcclType(described.scalar_type());
    if (!type.ok()) return QueuedWork::Failed(type.status());
    Fingerprint fp{absl::StrCat(op, has_send ? absl::StrCat("/to", dst) : "",
                                has_recv ? absl::StrCat("/from", src) : ""),
                   DtypeName(described.scalar_type()), described.numel(), group_, std::string(tag)};
    const ncclDataType_t t = *type;
    return Launch(std::move(fp), false, [this, send, dst, recv, src, has_send, has_recv, t] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (has_send) r = ncclSend(send.data_ptr(), send.numel(), t, dst, comm_, stream_);
      if (r == ncclSuccess && has_recv) {
        r = ncclRecv(recv.data_ptr(), recv.numel(), t, src, comm_, stream_);
      }
      ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  // Issues an op whose body enqueues NCCL work on stream_ after the caller's
  // stream has reached this point, then waits for it to finish.
  std::shared_ptr<Work> Launch(Fingerprint fp, bool collective,
                               std::function<ncclResult_t()> enqueue) {
    cudaEvent_t ready = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (err == cudaSuccess) {
      void* caller = options_.caller_stream ? options_.caller_stream() : nullptr;
      err = cudaEventRecord(ready, static_cast<cudaStream_t>(caller));
    }
    if (err != cudaSuccess) {
      if (ready != nullptr) cudaEventDestroy(ready);
      return QueuedWork::Failed(CudaStatus(err, "NCCL: recording the caller's stream"));
    }
    auto ready_event =
        std::shared_ptr<CUevent_st>(ready, [](cudaEvent_t e) { cudaEventDestroy(e); });
    return queue_->Issue(std::move(fp), collective, [this, ready_event, enqueue](uint32_t) {
      ThrowIfCuda(cudaSetDevice(options_.device), "cudaSetDevice");
      ThrowIfCuda(cudaStreamWaitEvent(stream_, ready_event.get(), 0), "cudaStreamWaitEvent");
      ncclResult_t r = enqueue();
      if (r != ncclSuccess && r != ncclInProgress) Fail(r, "enqueue");
      cudaEvent_t done = nullptr;
      ThrowIfCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
      std::unique_ptr<CUevent_st, void (*)(cudaEvent_t)> done_guard(
          done, [](cudaEvent_t e) { cudaEventDestroy(e); });
      ThrowIfCuda(cudaEventRecord(done, stream_), "cudaEventRecord");
      WaitForCompletion(done);
    });
  }

  // Polls until `done` fires; aborts NCCL on an asynchronous error, the op
  // timeout or an Abort() request. Note [Polling NCCL ops].
  void WaitForCompletion(cudaEvent_t done) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + options_.op_timeout;
    while (true) {
      cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ThrowIfCuda(q, "cudaEventQuery");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) Fail(async, "asynchronous error");
      if (abort_requested_.load()) {
        AbortComm();
        throw OpError{absl::AbortedError("NCCL op aborted")};
      }
      if (absl::Now() > deadline) {
        AbortComm();
        throw OpError{absl::DeadlineExceededError(
            absl::StrCat("exceeded the op timeout of ", absl::FormatDuration(options_.op_timeout),
                         "; NCCL communicator aborted"))};
      }
      if (absl::Now() - start < absl::Milliseconds(20)) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(absl::Microseconds(50));
      }
    }
  }

  [[noreturn]] void Fail(ncclResult_t r, absl::string_view what) {
    const std::string message = absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r), " (",
                                             ncclGetLastError(comm_), ")");
    AbortComm();
    throw OpError{absl::UnavailableError(message)};
  }

  // REQUIRES: called on the op thread.
  void AbortComm() {
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  absl::Status Execute(QueuedWork& work) {
    const std::string what = absl::StrCat("op #", work.seq(), " (", work.fingerprint().ToString(),
                                          ") on rank ", options_.rank, "/", options_.size);
    try {
      if (comm_ == nullptr) throw OpError{absl::UnavailableError("NCCL communicator was aborted")};
      work.RunBody();
      return absl::OkStatus();
    } catch (const OpError& e) {
      return absl::Status(e.status.code(), absl::StrCat(what, ": ", e.status.message()));
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat(what, " failed in LibTorch: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(what, " failed: ", e.what()));
    }
  }

  const NcclOptions options_;
  std::unique_ptr<Store> owned_store_;
  Store& store_;
  ncclComm_t comm_;  // owned by the op thread while the queue runs
  cudaStream_t stream_;
  float* barrier_;
  const std::vector<int> group_;
  FlightRecorder recorder_;
  std::atomic<bool> abort_requested_{false};
  GroupCache groups_;
  // Last member: its thread stops before anything it uses is destroyed.
  std::unique_ptr<OpQueue> queue_;
};

}  // namespace

// Note [Polling NCCL ops]
// The op thread watches each op's completion event so that a stuck op can be
// timed out and aborted, and an op completes (Work::Wait returns) only once
// the GPU has finished it. For the first 20 ms of an op the thread only
// yields between queries; then it sleeps 50 us. Measured with ddp_cuda_bench
// on one H200 (MLP 14.2 M, Chorus DDP / PyTorch DDP): yielding 1.10 and 1.12
// in two runs, sleeping 15 us (with a 1 ns timer slack) between queries 1.14
// in one; a CNN whose backward takes 5 ms was 1.06-1.07 either way. So the
// polling is not what costs; the host wait itself is: FinishGradientSync
// blocks the training thread until the last bucket is done, so the launches
// of the optimizer step and the next forward are no longer hidden behind the
// GPU's work (PyTorch DDP makes the stream, not the host, wait).

bool NcclAvailable() { return true; }

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                     Store& store) {
  return NcclCommunicator::Create(options, store, {}, nullptr);
}

}  // namespace chorus

#else  // !CHORUS_WITH_CUDA

namespace chorus {

bool NcclAvailable() { return false; }

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options,
                                                                     Store& store) {
  return absl::FailedPreconditionError(
      "the NCCL backend is not in this build; rebuild with `bazel build --config=cuda`");
}

}  // namespace chorus

#endif  // CHORUS_WITH_CUDA
