#include "worker/comm/nccl_communicator.h"

#include "absl/strings/str_cat.h"

#ifdef CHORUS_WITH_CUDA

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/comm/group_cache.h"
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

// Makes `device` the calling thread's current CUDA device for a scope, so
// that the legacy default stream (a null cudaStream_t) is that device's.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      changed_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~CurrentDevice() {
    if (changed_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

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

// An op enqueued on the GPU and not yet finished.
struct InFlight {
  std::shared_ptr<QueuedWork> work;
  // Recorded in front of the op's kernels and after them (Note [Device op
  // states] in flight_recorder.h).
  std::shared_ptr<CUevent_st> reached;
  std::shared_ptr<CUevent_st> done;
  absl::Time enqueued;
};

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
    {
      absl::MutexLock lock(&flight_mu_);
      stop_watcher_ = true;
    }
    if (watcher_.joinable()) watcher_.join();
    {
      absl::MutexLock lock(&comm_mu_);
      AbortCommLocked();
    }
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

  // NCCL's reduction for `op` on `dtype`: avg needs a floating dtype, and
  // NCCL has no bitwise reductions. Note [NCCL on one rank]: alone, the average is
  // the tensor itself.
  absl::StatusOr<ncclRedOp_t> NcclOp(ReduceOp op, at::ScalarType dtype, const char* what) const {
    if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": avg needs a floating dtype"));
    }
    switch (op) {
      case ReduceOp::kSum:
        return ncclSum;
      case ReduceOp::kAvg:
        return options_.size == 1 ? ncclSum : ncclAvg;
      case ReduceOp::kMin:
        return ncclMin;
      case ReduceOp::kMax:
        return ncclMax;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": NCCL has no bitwise reductions (", ReduceOpName(op),
            "); reduce the tensor on the CPU (the gloo backend) or use sum, min or max"));
    }
  }

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op, absl::string_view tag) override {
    if (absl::Status s = CheckTensor(tensor, "AllReduce"); !s.ok()) return QueuedWork::Failed(s);
    absl::StatusOr<ncclDataType_t> type = NcclType(tensor.scalar_type());
    if (!type.ok()) return QueuedWork::Failed(type.status());
    absl::StatusOr<ncclRedOp_t> reduce = NcclOp(op, tensor.scalar_type(), "AllReduce");
    if (!reduce.ok()) return QueuedWork::Failed(reduce.status());
    Fingerprint fp{absl::StrCat("allreduce/", ReduceOpName(op)), DtypeName(tensor.scalar_type()),
                   tensor.numel(), group_, std::string(tag)};
    const ncclDataType_t t = *type;
    const ncclRedOp_t nccl_op = *reduce;
    return Launch(std::move(fp), [this, tensor, t, nccl_op] {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), t, nccl_op, comm_,
                           stream_);
    });
  }

  std::shared_ptr<Work> ReduceScatter(at::Tensor input, at::Tensor output, ReduceOp op,
                                      absl::string_view tag) override {
    if (absl::Status s = CheckTensor(input, "ReduceScatter input"); !s.ok())
      return QueuedWork::Failed(s);
    if (absl::Status s = CheckTensor(output, "ReduceScatter output"); !s.ok())
      return QueuedWork::Failed(s);
    if (input.scalar_type() != output.scalar_type() ||
        input.numel() != output.numel() * options_.size) {
      return QueuedWork::Failed(absl::InvalidArgumentError(
          "ReduceScatter: input must hold size() * output.numel() elements of output's dtype"));
    }
    absl::StatusOr<ncclDataType_t> type = NcclType(input.scalar_type());
    if (!type.ok()) return QueuedWork::Failed(type.status());
    absl::StatusOr<ncclRedOp_t> reduce = NcclOp(op, input.scalar_type(), "ReduceScatter");
    if (!reduce.ok()) return QueuedWork::Failed(reduce.status());
    Fingerprint fp{absl::StrCat("reducescatter/", ReduceOpName(op)),
                   DtypeName(input.scalar_type()), input.numel(), group_, std::string(tag)};
    const ncclDataType_t t = *type;
    const ncclRedOp_t nccl_op = *reduce;
    return Launch(std::move(fp), [this, input, output, t, nccl_op] {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), t, nccl_op,
                               comm_, stream_);
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
    return Launch(std::move(fp), [this, tensor, t, root] {
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
    return Launch(std::move(fp), [this, input, output, t] {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), t, comm_, stream_);
    });
  }

  std::shared_ptr<Work> Barrier(absl::string_view tag) override {
    Fingerprint fp{"barrier", "", 0, group_, std::string(tag)};
    return Launch(std::move(fp), [this] {
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
    // The watcher sees the flag within a poll interval, aborts NCCL and fails
    // every op in flight; nothing new is enqueued once the queue is shut.
    queue_->Shutdown(absl::AbortedError(absl::StrCat("communicator aborted: ", reason)),
                     [this] { abort_requested_.store(true); });
    absl::MutexLock lock(&flight_mu_);
    flight_mu_.Await(absl::Condition(
        +[](std::deque<InFlight>* ops) { return ops->empty(); }, &in_flight_));
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
        recorder_(options.flight_recorder_capacity, options.clock,
                  absl::StrCat("cuda:", options.device)),
        queue_(std::make_unique<OpQueue>(recorder_,
                                         [this](QueuedWork& work) { return Execute(work); })) {
    watcher_ = std::thread([this] { WatchLoop(); });
  }

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
    const Peers peers{has_send ? dst : -1, has_recv ? src : -1};
    return Launch(std::move(fp), peers, [this, send, dst, recv, src, has_send, has_recv, t] {
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

  // A point-to-point op's peers; -1 for a part it does not have.
  struct Peers {
    int send_to = -1;
    int recv_from = -1;
  };

  // Issues an op whose body enqueues NCCL work on stream_ after the caller's
  // stream has reached this point; the watcher finishes it when the GPU has
  // (Note [Deferred completion] in op_queue.h). A collective, or with
  // `peers` a point-to-point op.
  std::shared_ptr<Work> Launch(Fingerprint fp, std::function<ncclResult_t()> enqueue) {
    return Launch(std::move(fp), std::nullopt, std::move(enqueue));
  }
  std::shared_ptr<Work> Launch(Fingerprint fp, std::optional<Peers> peers,
                               std::function<ncclResult_t()> enqueue) {
    cudaEvent_t ready = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (err == cudaSuccess) {
      CurrentDevice on(options_.device);
      err = cudaEventRecord(ready, CallerStream());
    }
    if (err != cudaSuccess) {
      if (ready != nullptr) cudaEventDestroy(ready);
      return QueuedWork::Failed(CudaStatus(err, "NCCL: recording the caller's stream"));
    }
    auto ready_event =
        std::shared_ptr<CUevent_st>(ready, [](cudaEvent_t e) { cudaEventDestroy(e); });
    auto body = [this, ready_event, enqueue] {
      ThrowIfCuda(cudaSetDevice(options_.device), "cudaSetDevice");
      ThrowIfCuda(cudaStreamWaitEvent(stream_, ready_event.get(), 0), "cudaStreamWaitEvent");
      std::shared_ptr<CUevent_st> reached_event = NewEvent();
      ThrowIfCuda(cudaEventRecord(reached_event.get(), stream_), "cudaEventRecord");
      {
        absl::MutexLock lock(&comm_mu_);
        if (comm_ == nullptr) throw OpError{absl::UnavailableError("NCCL communicator was aborted")};
        ncclResult_t r = enqueue();
        if (r != ncclSuccess && r != ncclInProgress) FailLocked(r, "enqueue");
      }
      std::shared_ptr<CUevent_st> done_event = NewEvent();
      ThrowIfCuda(cudaEventRecord(done_event.get(), stream_), "cudaEventRecord");
      std::shared_ptr<QueuedWork> work = current_->shared_from_this();
      work->Defer([this, done_event] {
        CurrentDevice on(options_.device);
        return CudaStatus(cudaStreamWaitEvent(CallerStream(), done_event.get(), 0),
                          "NCCL: ordering the caller's stream after the op");
      });
      absl::MutexLock lock(&flight_mu_);
      in_flight_.push_back(
          {std::move(work), std::move(reached_event), std::move(done_event), absl::Now()});
    };
    if (peers.has_value()) {
      return queue_->IssuePointToPoint(std::move(fp), peers->send_to, peers->recv_from,
                                       std::move(body));
    }
    return queue_->Issue(std::move(fp), true, [body = std::move(body)](uint32_t) { body(); });
  }

  // A CUDA event without timing, destroyed with its last reference.
  static std::shared_ptr<CUevent_st> NewEvent() {
    cudaEvent_t event = nullptr;
    ThrowIfCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    return std::shared_ptr<CUevent_st>(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
  }

  cudaStream_t CallerStream() const {
    return static_cast<cudaStream_t>(options_.caller_stream ? options_.caller_stream() : nullptr);
  }

  // Finishes the ops in flight in issue order as their completion events fire
  // (Note [Polling NCCL ops]). An asynchronous NCCL error, an op older than
  // the op timeout, or Abort() aborts NCCL and fails every op in flight.
  void WatchLoop() {
    cudaSetDevice(options_.device);
    while (true) {
      InFlight front;
      {
        absl::MutexLock lock(&flight_mu_);
        flight_mu_.Await(absl::Condition(
            +[](NcclCommunicator* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->flight_mu_) {
              return c->stop_watcher_ || !c->in_flight_.empty();
            },
            this));
        if (in_flight_.empty()) return;  // stopping
        front = in_flight_.front();
      }
      absl::Status status = PollUntilDone(front);
      std::deque<InFlight> finished;
      {
        absl::MutexLock lock(&flight_mu_);
        if (status.ok()) {
          finished.push_back(std::move(in_flight_.front()));
          in_flight_.pop_front();
        } else {
          finished.swap(in_flight_);
        }
      }
      // The first failure breaks the queue; the later ops report it.
      for (InFlight& op : finished) {
        queue_->Complete(*op.work, status.ok() ? status : Described(*op.work, status));
      }
    }
  }

  // OK once `op`'s completion event fired; otherwise the error that aborted
  // the communicator.
  // Marks it running in the flight recorder once the GPU has reached it.
  absl::Status PollUntilDone(const InFlight& op) {
    const absl::Time deadline = op.enqueued + options_.op_timeout;
    bool running = false;
    while (true) {
      if (!running && cudaEventQuery(op.reached.get()) == cudaSuccess) {
        recorder_.Running(op.work->seq());
        running = true;
      }
      cudaError_t q = cudaEventQuery(op.done.get());
      if (q == cudaSuccess) {
        if (!running) recorder_.Running(op.work->seq());
        return absl::OkStatus();
      }
      if (absl::Status s = CheckInFlight(q, deadline); !s.ok()) return s;
      if (absl::Now() - op.enqueued < absl::Milliseconds(20)) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(absl::Microseconds(50));
      }
    }
  }

  // While an op is in flight: the error that ends it, after aborting NCCL,
  // or OK to keep waiting. `query` is its completion event's last answer.
  absl::Status CheckInFlight(cudaError_t query, absl::Time deadline) {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return absl::UnavailableError("NCCL communicator was aborted");
    if (query != cudaErrorNotReady) {
      AbortCommLocked();
      return CudaStatus(query, "cudaEventQuery");
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string message = absl::StrCat("NCCL asynchronous error: ",
                                               ncclGetErrorString(async), " (",
                                               ncclGetLastError(comm_), ")");
      AbortCommLocked();
      return absl::UnavailableError(message);
    }
    if (abort_requested_.load()) {
      AbortCommLocked();
      return absl::AbortedError("NCCL op aborted");
    }
    if (absl::Now() > deadline) {
      AbortCommLocked();
      return absl::DeadlineExceededError(
          absl::StrCat("exceeded the op timeout of ", absl::FormatDuration(options_.op_timeout),
                       "; NCCL communicator aborted"));
    }
    return absl::OkStatus();
  }

  std::string Describe(const QueuedWork& work) const {
    return absl::StrCat("op #", work.seq(), " (", work.fingerprint().ToString(), ") on rank ",
                        options_.rank, "/", options_.size);
  }

  absl::Status Described(const QueuedWork& work, const absl::Status& status) const {
    return absl::Status(status.code(), absl::StrCat(Describe(work), ": ", status.message()));
  }

  [[noreturn]] void FailLocked(ncclResult_t r, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    const std::string message = absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r), " (",
                                             ncclGetLastError(comm_), ")");
    AbortCommLocked();
    throw OpError{absl::UnavailableError(message)};
  }

  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  // Runs on the op thread: the body enqueues the op (Launch).
  absl::Status Execute(QueuedWork& work) {
    try {
      current_ = &work;
      work.RunBody();
      return absl::OkStatus();
    } catch (const OpError& e) {
      return Described(work, e.status);
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat(Describe(work), " failed in LibTorch: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(Describe(work), " failed: ", e.what()));
    }
  }

  const NcclOptions options_;
  std::unique_ptr<Store> owned_store_;
  Store& store_;
  // NCCL calls on comm_ come from the op thread (enqueue) and the watcher
  // (errors, abort); null once aborted.
  absl::Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_);
  cudaStream_t stream_;
  float* barrier_;
  const std::vector<int> group_;
  FlightRecorder recorder_;
  std::atomic<bool> abort_requested_{false};
  GroupCache groups_;
  QueuedWork* current_ = nullptr;  // the op thread's op, while its body runs
  absl::Mutex flight_mu_;
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(flight_mu_);
  bool stop_watcher_ ABSL_GUARDED_BY(flight_mu_) = false;
  std::thread watcher_;
  // Last member: its thread stops before anything it uses is destroyed.
  std::unique_ptr<OpQueue> queue_;
};

}  // namespace

// Note [Polling NCCL ops]
// The watcher queries the oldest op's completion event so that a stuck op can
// be timed out and aborted, and an op completes (Work::Wait returns) only
// once the GPU has finished it. For the first 20 ms of an op it only yields
// between queries; then it sleeps 50 us. How it polls hardly matters for
// speed: with bench/ddp_cuda_bench on one H200 (Chorus DDP / PyTorch DDP, MLP
// 14.2 M), when the op thread itself waited for each op, yielding gave 1.10
// and 1.12 and sleeping 15 us 1.14, a CNN 1.06-1.07 either way. What cost
// was the host waiting at all: with the op thread only enqueueing and DDP
// ordering its stream after the buckets (Work::WaitOnDevice), the same runs
// give 1.025 and 1.003 (docs/gpu.md).

// Note [NCCL on one rank]
// With one rank NCCL all-reduces in place without launching anything, except
// for ncclAvg on floating types: NCCL scales by 1/nranks before summing, and
// on one rank that scaling is a kernel that reads and writes the whole
// tensor, even though the factor is 1. So a one-rank average is sent as a
// sum, which gives the same bits. In profiler traces of bench/ddp_cuda_bench on one
// H100 (MLP 14.2 M, tests/gpu/trace_summary.py), that kernel ran three times
// a step for 57 us on the communicator's stream, beside the backward pass,
// and slowed the backward's matrix products by another ~17 us; PyTorch DDP,
// which sums and divides while copying into its buckets, launched no NCCL
// kernel at all.

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
