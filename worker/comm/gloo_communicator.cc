#include "worker/comm/gloo_communicator.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/env_names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"
#include "worker/comm/gloo_algorithms.h"
#include "worker/comm/gloo_store.h"
#include "worker/comm/group_cache.h"
#include "worker/comm/op_queue.h"
#include "worker/comm/p2p_lanes.h"
#include "worker/comm/shm_allreduce.h"
#include "worker/comm/transport_tuner.h"

namespace chorus {

namespace {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

// Slots live in the top byte's namespace: one prefix for collectives (the
// rest is the collective's tag), one for point-to-point (the rest counts
// messages per pair of ranks).
constexpr uint64_t kCollectiveSlotPrefix = uint64_t{0x7e} << 56;

// Slot of a collective: its index in the collective order, plus 24 bits of
// its fingerprint (op, dtype, count, tag). Ranks that issue different
// collectives at the same index therefore never exchange data: instead of
// mixing one op's bytes into another (or failing on a size mismatch) they
// wait, and the hang detector reports the MISMATCH with both fingerprints.
// (FNV-1a: the same on every rank and every run, unlike absl::Hash.)
uint64_t FingerprintSlotBits(const Fingerprint& fp) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](absl::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // field separator
  };
  mix(fp.op);
  mix(fp.dtype);
  mix(std::to_string(fp.count));
  mix(fp.tag);
  return kCollectiveSlotPrefix | (((h ^ (h >> 24) ^ (h >> 48)) & 0xffffff) << 32);
}
constexpr uint64_t kP2pSlotPrefix = uint64_t{0x7f} << 56;
// Messages that agree on an all-reduce's transport timings (TransportTuner)
// reuse that op's slot under their own prefix.
constexpr uint64_t kTuningSlotPrefix = uint64_t{0x7d} << 56;
constexpr uint64_t kSlotPrefixMask = uint64_t{0xff} << 56;

// bfloat16 is not a gloo type: reduce through float.
template <typename Combine>
void Bf16Reduce(void* c, const void* a, const void* b, size_t n, Combine combine) {
  auto* out = static_cast<c10::BFloat16*>(c);
  const auto* x = static_cast<const c10::BFloat16*>(a);
  const auto* y = static_cast<const c10::BFloat16*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = c10::BFloat16(combine(static_cast<float>(x[i]), static_cast<float>(y[i])));
  }
}

using RawReduceFn = void (*)(void*, const void*, const void*, size_t);

bool EnvironmentForcesSharedMemory() {
  const char* env = std::getenv(kEnvGlooShm);
  return env != nullptr && std::string(env) == "1";
}

template <typename T>
ReduceFn GlooReduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return static_cast<RawReduceFn>(&gloo::min<T>);
    case ReduceOp::kMax:
      return static_cast<RawReduceFn>(&gloo::max<T>);
    default:
      return static_cast<RawReduceFn>(&gloo::sum<T>);
  }
}

// c = a OP b elementwise for the bitwise ops (gloo has none).
template <typename T, typename Combine>
void Bitwise(void* c, const void* a, const void* b, size_t n, Combine combine) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(combine(x[i], y[i]));
}

// Integer and bool dtypes: every op but kAvg; the bitwise ones too.
template <typename T>
ReduceFn IntegralReduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kBand:
      return [](void* c, const void* a, const void* b, size_t n) {
        Bitwise<T>(c, a, b, n, [](T x, T y) { return x & y; });
      };
    case ReduceOp::kBor:
      return [](void* c, const void* a, const void* b, size_t n) {
        Bitwise<T>(c, a, b, n, [](T x, T y) { return x | y; });
      };
    case ReduceOp::kBxor:
      return [](void* c, const void* a, const void* b, size_t n) {
        Bitwise<T>(c, a, b, n, [](T x, T y) { return x ^ y; });
      };
    case ReduceOp::kSum:
      if (std::is_same<T, bool>::value) {  // true + true is true: their or
        return [](void* c, const void* a, const void* b, size_t n) {
          Bitwise<T>(c, a, b, n, [](T x, T y) { return x | y; });
        };
      }
      return GlooReduceFn<T>(op);
    default:
      return GlooReduceFn<T>(op);
  }
}


// Divides `count` elements in place by `size`. Plain loops, not ATen: this
// runs on the communicator's thread, where an ATen op could start an OpenMP
// team that competes with the training thread for cores.
template <typename T>
void DivideInPlace(void* data, size_t count, int size) {
  T* p = static_cast<T*>(data);
  const float inv = 1.0f / static_cast<float>(size);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(static_cast<float>(p[i]) * inv);
}

template <>
void DivideInPlace<double>(void* data, size_t count, int size) {
  double* p = static_cast<double*>(data);
  const double inv = 1.0 / size;
  for (size_t i = 0; i < count; ++i) p[i] *= inv;
}

std::function<void(void*, size_t)> AverageFunction(at::ScalarType dtype, int size) {
  switch (dtype) {
    case at::kFloat:
      return [size](void* d, size_t n) { DivideInPlace<float>(d, n, size); };
    case at::kDouble:
      return [size](void* d, size_t n) { DivideInPlace<double>(d, n, size); };
    case at::kHalf:
      return [size](void* d, size_t n) { DivideInPlace<c10::Half>(d, n, size); };
    default:
      return [size](void* d, size_t n) { DivideInPlace<c10::BFloat16>(d, n, size); };
  }
}

ReduceFn Bf16ReduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return [](void* c, const void* a, const void* b, size_t n) {
        Bf16Reduce(c, a, b, n, [](float x, float y) { return std::min(x, y); });
      };
    case ReduceOp::kMax:
      return [](void* c, const void* a, const void* b, size_t n) {
        Bf16Reduce(c, a, b, n, [](float x, float y) { return std::max(x, y); });
      };
    default:
      return [](void* c, const void* a, const void* b, size_t n) {
        Bf16Reduce(c, a, b, n, [](float x, float y) { return x + y; });
      };
  }
}

bool IsBitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// The reduction of `op` over elements of `dtype`; INVALID_ARGUMENT naming
// both for a pair Gloo cannot reduce.
absl::StatusOr<ReduceFn> ReduceFunctionFor(at::ScalarType dtype, ReduceOp op) {
  const bool floating = at::isFloatingType(dtype);
  if (op == ReduceOp::kAvg && !floating) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllReduce: avg needs a floating dtype, got ", DtypeName(dtype)));
  }
  if (IsBitwise(op) && floating) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: ", ReduceOpName(op),
                                                   " needs an integer or bool dtype, got ",
                                                   DtypeName(dtype)));
  }
  switch (dtype) {
    case at::kFloat:
      return GlooReduceFn<float>(op);
    case at::kDouble:
      return GlooReduceFn<double>(op);
    case at::kHalf:
      return GlooReduceFn<gloo::float16>(op);
    case at::kBFloat16:
      return Bf16ReduceFn(op);
    case at::kInt:
      return IntegralReduceFn<int32_t>(op);
    case at::kLong:
      return IntegralReduceFn<int64_t>(op);
    case at::kByte:
      return IntegralReduceFn<uint8_t>(op);
    case at::kChar:
      return IntegralReduceFn<int8_t>(op);
    case at::kBool:
      return IntegralReduceFn<bool>(op);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "AllReduce: dtype ", DtypeName(dtype),
          " is not supported; use float32, float64, float16, bfloat16, int64, int32, int8, "
          "uint8 or bool"));
  }
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const GlooOptions& options, Store& store,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, std::vector<int> group,
                   std::unique_ptr<Store> owned_store, std::unique_ptr<ShmAllreduce> shm)
      : options_(options),
        owned_store_(std::move(owned_store)),
        store_(owned_store_ ? *owned_store_ : store),
        device_(std::move(device)),
        context_(std::move(context)),
        group_(std::move(group)),
        timeout_(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.op_timeout))),
        recorder_(options.flight_recorder_capacity, options.clock),
        send_counts_(options.size, 0),
        recv_counts_(options.size, 0),
        shm_(std::move(shm)),
        measure_transport_(options.measure_transport && !EnvironmentForcesSharedMemory()),
        queue_(std::make_unique<OpQueue>(recorder_,
                                         [this](QueuedWork& work) { return Execute(work); })),
        lanes_(std::make_unique<P2pLanes>([this](QueuedWork& work, absl::Status status) {
          queue_->Complete(work, Described(work, status));
        })) {}

  ~GlooCommunicator() override { Abort("communicator destroyed"); }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  const std::vector<int>& group() const override { return group_; }
  const FlightRecorder& flight_recorder() const override { return recorder_; }

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op, absl::string_view tag) override {
    if (absl::Status s = CheckTensor(tensor, "AllReduce"); !s.ok()) return QueuedWork::Failed(s);
    const at::ScalarType dtype = tensor.scalar_type();
    absl::StatusOr<ReduceFn> reduce = ReduceFunctionFor(dtype, op);
    if (!reduce.ok()) return QueuedWork::Failed(reduce.status());
    ReduceFn fn = *std::move(reduce);
    Fingerprint fp{absl::StrCat("allreduce/", ReduceOpName(op)), DtypeName(dtype), tensor.numel(),
                   group_, std::string(tag)};
    const int size = options_.size;
    const uint64_t slot = FingerprintSlotBits(fp);
    return Issue(std::move(fp), /*collective=*/true,
                 [this, tensor, op, fn, size, dtype, slot](uint32_t gloo_tag) {
                   if (tensor.numel() == 0) return;
                   at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
                   AllreduceOptions opts;
                   opts.context = context_.get();
                   opts.abort = &abort_;
                   opts.data = buffer.data_ptr();
                   opts.count = static_cast<size_t>(buffer.numel());
                   opts.element_size = buffer.element_size();
                   opts.reduce = fn;
                   if (op == ReduceOp::kAvg && size > 1)
                     opts.finalize = AverageFunction(dtype, size);
                   opts.slot = slot | gloo_tag;
                   opts.timeout = timeout_;
                   opts.segment_bytes = options_.segment_bytes;
                   opts.scratch = &scratch_;
                   if (shm_ == nullptr) {
                     RingAllreduce(opts);
                   } else if (!measure_transport_) {
                     RunShm(opts, op, dtype);
                   } else {
                     RunMeasured(opts, op, dtype);
                   }
                   // A single rank's average is itself; otherwise the ring divided.
                   if (!buffer.is_same(tensor)) tensor.copy_(buffer);
                 });
  }

  void RunShm(const AllreduceOptions& opts, ReduceOp op, at::ScalarType dtype) {
    ShmAllreduce::Op shm_op;
    shm_op.data = opts.data;
    shm_op.count = opts.count;
    shm_op.element_size = opts.element_size;
    shm_op.reduce = opts.reduce;
    shm_op.finalize = opts.finalize;
    shm_op.float_sum = dtype == at::kFloat && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
    shm_op.scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(options_.size) : 1.0f;
    shm_op.slot = opts.slot;
    shm_op.timeout = timeout_;
    shm_->Run(shm_op, abort_);
  }

  // The maximum over the ranks of `count` doubles, over the TCP ring, in
  // the tuner's own slot beside the op's `slot`.
  void TuningMax(double* values, size_t count, uint64_t slot) {
    AllreduceOptions max;
    max.context = context_.get();
    max.abort = &abort_;
    max.data = values;
    max.count = count;
    max.element_size = sizeof(double);
    max.reduce = static_cast<RawReduceFn>(&gloo::max<double>);
    max.slot = (slot & ~kSlotPrefixMask) | kTuningSlotPrefix;
    max.timeout = timeout_;
    max.scratch = &scratch_;
    RingAllreduce(max);
  }

  // Runs the all-reduce on the path the tuner picks; once a size class has
  // its samples, the ranks agree on the slowest rank's timings over TCP and
  // every rank decides alike.
  void RunMeasured(const AllreduceOptions& opts, ReduceOp op, at::ScalarType dtype) {
    const size_t bytes = opts.count * opts.element_size;
    const TransportTuner::Path path = tuner_.Next(bytes);
    if (tuner_.Measuring(bytes)) {
      // A sample starts when every rank is there: otherwise it times the
      // wait for the last rank to arrive (in DDP, a rank still in backward),
      // which drowns the difference between the paths.
      double nothing = 0;
      TuningMax(&nothing, 1, opts.slot);
    }
    const absl::Time start = absl::Now();
    if (path == TransportTuner::Path::kSharedMemory) {
      RunShm(opts, op, dtype);
    } else {
      RingAllreduce(opts);
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!tuner_.Record(bytes, path, seconds)) return;
    const TransportTuner::Timings measured = tuner_.Measured(bytes);
    double timings[2] = {measured.shared_memory, measured.tcp};
    TuningMax(timings, 2, opts.slot);
    const std::string line =
        absl::StrCat("rank ", options_.rank, ": ", tuner_.Decide(bytes, {timings[0], timings[1]}));
    LOG(INFO) << line;
    if (options_.on_transport_decision) options_.on_transport_decision(line);
  }

  at::Tensor NewBuffer(int64_t numel, const at::TensorOptions& options) override {
    if (shm_ != nullptr && options.device().is_cpu()) {
      at::Tensor buffer = shm_->NewBuffer(numel, options);
      if (buffer.defined()) return buffer;
    }
    return at::empty({numel}, options);
  }

  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root, absl::string_view tag) override {
    if (absl::Status s = CheckTensor(tensor, "Broadcast"); !s.ok()) return QueuedWork::Failed(s);
    if (absl::Status s = CheckPeer(root, "Broadcast", "root", /*self_ok=*/true); !s.ok()) {
      return QueuedWork::Failed(s);
    }
    Fingerprint fp{absl::StrCat("broadcast/root", root), DtypeName(tensor.scalar_type()),
                   tensor.numel(), group_, std::string(tag)};
    const uint64_t slot = FingerprintSlotBits(fp);
    return Issue(std::move(fp), true, [this, tensor, root, slot](uint32_t gloo_tag) {
      if (tensor.numel() == 0) return;
      at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
      BroadcastOptions opts;
      opts.context = context_.get();
      opts.abort = &abort_;
      opts.data = buffer.data_ptr();
      opts.bytes = buffer.nbytes();
      opts.root = root;
      opts.slot = slot | gloo_tag;
      opts.timeout = timeout_;
      DirectBroadcast(opts);
      if (!buffer.is_same(tensor)) tensor.copy_(buffer);
    });
  }

  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output,
                                  absl::string_view tag) override {
    if (absl::Status s = CheckTensor(input, "AllGather input"); !s.ok())
      return QueuedWork::Failed(s);
    if (absl::Status s = CheckTensor(output, "AllGather output"); !s.ok()) {
      return QueuedWork::Failed(s);
    }
    if (input.scalar_type() != output.scalar_type() ||
        output.numel() != input.numel() * options_.size) {
      return QueuedWork::Failed(absl::InvalidArgumentError(
          absl::StrCat("AllGather: output must hold size() * input.numel() = ", options_.size,
                       " * ", input.numel(), " elements of ", DtypeName(input.scalar_type()),
                       ", got ", output.numel(), " of ", DtypeName(output.scalar_type()))));
    }
    Fingerprint fp{"allgather", DtypeName(input.scalar_type()), input.numel(), group_,
                   std::string(tag)};
    const uint64_t slot = FingerprintSlotBits(fp);
    return Issue(std::move(fp), true, [this, input, output, slot](uint32_t gloo_tag) {
      if (input.numel() == 0) return;
      at::Tensor out = output.is_contiguous() ? output : output.contiguous();
      // This rank's block goes in place first; the ring brings the others.
      out.view({-1})
          .narrow(0, input.numel() * options_.rank, input.numel())
          .copy_(input.reshape({-1}));
      AllgatherOptions opts;
      opts.context = context_.get();
      opts.abort = &abort_;
      opts.output = out.data_ptr();
      opts.block_bytes = input.nbytes();
      opts.slot = slot | gloo_tag;
      opts.timeout = timeout_;
      RingAllgather(opts);
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  std::shared_ptr<Work> ReduceScatter(at::Tensor input, at::Tensor output, ReduceOp op,
                                      absl::string_view tag) override {
    if (absl::Status s = CheckTensor(input, "ReduceScatter input"); !s.ok())
      return QueuedWork::Failed(s);
    if (absl::Status s = CheckTensor(output, "ReduceScatter output"); !s.ok())
      return QueuedWork::Failed(s);
    const at::ScalarType dtype = input.scalar_type();
    if (output.scalar_type() != dtype || input.numel() != options_.size * output.numel()) {
      return QueuedWork::Failed(absl::InvalidArgumentError(absl::StrCat(
          "ReduceScatter: the input (", input.numel(), " ", DtypeName(dtype),
          ") must hold size x the output's elements (", options_.size, " x ", output.numel(),
          " ", DtypeName(output.scalar_type()), ") of its dtype")));
    }
    absl::StatusOr<ReduceFn> reduce = ReduceFunctionFor(dtype, op);
    if (!reduce.ok()) return QueuedWork::Failed(reduce.status());
    Fingerprint fp{absl::StrCat("reducescatter/", ReduceOpName(op)), DtypeName(dtype),
                   input.numel(), group_, std::string(tag)};
    const uint64_t slot = FingerprintSlotBits(fp);
    return Issue(std::move(fp), true,
                 [this, input, output, op, fn = *std::move(reduce), slot](uint32_t gloo_tag) {
                   if (output.numel() == 0) return;
                   // The ring reduces in place; the caller's input stays as it was.
                   at::Tensor work = input.reshape({-1}).clone();
                   ReduceScatterOptions opts;
                   opts.context = context_.get();
                   opts.abort = &abort_;
                   opts.data = work.data_ptr();
                   opts.block_count = static_cast<size_t>(output.numel());
                   opts.element_size = work.element_size();
                   opts.reduce = fn;
                   opts.slot = slot | gloo_tag;
                   opts.timeout = timeout_;
                   opts.scratch = &scratch_;
                   RingReduceScatter(opts);
                   at::Tensor mine = work.narrow(0, options_.rank * output.numel(), output.numel());
                   if (op == ReduceOp::kAvg && options_.size > 1) {
                     AverageFunction(work.scalar_type(), options_.size)(mine.data_ptr(),
                                                                        mine.numel());
                   }
                   output.copy_(mine.view(output.sizes()));
                 });
  }

  std::shared_ptr<Work> Barrier(absl::string_view tag) override {
    Fingerprint fp{"barrier", "", 0, group_, std::string(tag)};
    const uint64_t slot = FingerprintSlotBits(fp);
    return Issue(std::move(fp), true, [this, slot](uint32_t gloo_tag) {
      BarrierOptions opts;
      opts.context = context_.get();
      opts.abort = &abort_;
      opts.slot = slot | gloo_tag;
      opts.timeout = timeout_;
      DisseminationBarrier(opts);
    });
  }

  std::shared_ptr<Work> Send(at::Tensor tensor, int dst, absl::string_view tag) override {
    return SendRecvImpl(tensor, dst, at::Tensor(), -1, tag, "send");
  }

  std::shared_ptr<Work> Recv(at::Tensor tensor, int src, absl::string_view tag) override {
    return SendRecvImpl(at::Tensor(), -1, tensor, src, tag, "recv");
  }

  std::shared_ptr<Work> SendRecv(at::Tensor send, int dst, at::Tensor recv, int src,
                                 absl::string_view tag) override {
    return SendRecvImpl(send, dst, recv, src, tag, "sendrecv");
  }

  absl::StatusOr<std::shared_ptr<Communicator>> NewGroup(std::vector<int> ranks) override {
    return groups_.GetOrCreate(
        ranks, options_.size, options_.rank, group_, store_,
        [this](int index, std::vector<int> world, std::unique_ptr<Store> store) {
          GlooOptions child = options_;
          child.rank = index;
          child.size = static_cast<int>(world.size());
          Store& ns = *store;
          return Create(child, ns, device_, std::move(world), std::move(store));
        });
  }

  void Abort(absl::string_view reason) override {
    groups_.AbortAll(reason);
    queue_->Shutdown(absl::AbortedError(absl::StrCat("communicator aborted: ", reason)), [this] {
      // Wakes the op in flight, blocked on a peer that may never answer, and
      // tells the peers this rank is gone.
      abort_.Abort();
      if (shm_ != nullptr) shm_->Close();
      try {
        context_->closeConnections();
      } catch (const std::exception& e) {
        LOG(WARNING) << "closing gloo connections: " << e.what();
      }
    });
  }

  // Connects a gloo context of options.size ranks through `store`.
  static absl::StatusOr<std::shared_ptr<Communicator>> Create(
      const GlooOptions& options, Store& store, std::shared_ptr<gloo::transport::Device> device,
      std::vector<int> group, std::unique_ptr<Store> owned_store) {
    if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo: rank ", options.rank, " is outside [0, ", options.size, ")"));
    }
    if (options.op_timeout <= absl::ZeroDuration() ||
        options.connect_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("gloo: op_timeout and connect_timeout must be > 0");
    }
    std::shared_ptr<gloo::rendezvous::Context> context;
    try {
      if (device == nullptr) {
        gloo::transport::tcp::attr attr;
        attr.hostname = options.hostname;
        device = gloo::transport::tcp::CreateDevice(attr);
      }
      context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
      context->setTimeout(
          std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout)));
      GlooStore gloo_store(owned_store ? *owned_store : store, options.connect_timeout);
      context->connectFullMesh(gloo_store, device);
      context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.op_timeout)));
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = absl::StrContains(what, "DEADLINE_EXCEEDED") ||
                             absl::StrContains(what, "Timed out") ||
                             absl::StrContains(what, "timed out");
      const std::string message =
          absl::StrCat("gloo: rank ", options.rank, " of ", options.size,
                       " could not connect to its peers (store keys are peer ranks): ", what);
      return timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
    }
    std::unique_ptr<ShmAllreduce> shm;
    const char* env = std::getenv(kEnvGlooShm);
    if (options.shared_memory && !(env != nullptr && std::string(env) == "0")) {
      ShmAllreduce::Options shm_options;
      shm_options.rank = options.rank;
      shm_options.size = options.size;
      shm_options.segment_bytes = options.shm_segment_bytes;
      absl::StatusOr<std::unique_ptr<ShmAllreduce>> connected = ShmAllreduce::Connect(
          shm_options, owned_store ? *owned_store : store, absl::Now() + options.connect_timeout);
      if (!connected.ok()) {
        return absl::Status(connected.status().code(),
                            absl::StrCat("gloo: rank ", options.rank, " of ", options.size,
                                         " could not set up shared memory with its peers: ",
                                         connected.status().message()));
      }
      shm = *std::move(connected);
    }
    return std::shared_ptr<Communicator>(
        new GlooCommunicator(options, store, std::move(device), std::move(context),
                             std::move(group), std::move(owned_store), std::move(shm)));
  }

 private:
  absl::Status CheckTensor(const at::Tensor& t, absl::string_view what) const {
    if (!t.defined())
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor is undefined"));
    if (!t.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the gloo backend takes CPU tensors, got one on ", t.device().str(),
                       "; use the NCCL backend for CUDA tensors"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckPeer(int peer, absl::string_view what, absl::string_view role,
                         bool self_ok) const {
    if (peer < 0 || peer >= options_.size || (!self_ok && peer == options_.rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", role, " must be in [0, ", options_.size, ")",
                       self_ok ? "" : " and not this rank", ", got ", peer));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Work> SendRecvImpl(at::Tensor send, int dst, at::Tensor recv, int src,
                                     absl::string_view tag, absl::string_view op) {
    const bool has_send = dst >= 0 || op != "recv";
    const bool has_recv = src >= 0 || op != "send";
    if (has_send) {
      if (absl::Status s = CheckTensor(send, absl::StrCat(op, " send")); !s.ok())
        return QueuedWork::Failed(s);
      if (absl::Status s = CheckPeer(dst, op, "dst", false); !s.ok()) return QueuedWork::Failed(s);
    }
    if (has_recv) {
      if (absl::Status s = CheckTensor(recv, absl::StrCat(op, " recv")); !s.ok())
        return QueuedWork::Failed(s);
      if (absl::Status s = CheckPeer(src, op, "src", false); !s.ok()) return QueuedWork::Failed(s);
    }
    const at::Tensor& described = has_send ? send : recv;
    Fingerprint fp{absl::StrCat(op, has_send ? absl::StrCat("/to", dst) : "",
                                has_recv ? absl::StrCat("/from", src) : ""),
                   DtypeName(described.scalar_type()), described.numel(), group_, std::string(tag)};
    auto body = [this, send, dst, recv, src, has_send, has_recv] {
      // Slots count per peer pair, so the k-th send a->b meets the k-th recv b<-a.
      uint64_t send_slot = 0;
      uint64_t recv_slot = 0;
      if (has_send) send_slot = kP2pSlotPrefix | send_counts_[dst]++;
      if (has_recv) recv_slot = kP2pSlotPrefix | recv_counts_[src]++;
      at::Tensor out = has_send ? send.contiguous() : at::Tensor();
      at::Tensor in = has_recv ? (recv.is_contiguous() ? recv : recv.contiguous()) : at::Tensor();
      std::shared_ptr<AbortableBuffer> in_buf;
      std::shared_ptr<AbortableBuffer> out_buf;
      if (has_recv) {
        in_buf = std::make_shared<AbortableBuffer>(*context_, abort_, in.data_ptr(), in.nbytes());
        in_buf->Recv(src, recv_slot, 0, in.nbytes());
      }
      if (has_send) {
        out_buf =
            std::make_shared<AbortableBuffer>(*context_, abort_, out.data_ptr(), out.nbytes());
        out_buf->Send(dst, send_slot, 0, out.nbytes());
      }
      if (has_send && has_recv) {  // a SendRecv: one op, run to its end here
        out_buf->WaitSend(timeout_);
        in_buf->WaitRecv(timeout_);
        if (!in.is_same(recv)) recv.copy_(in);
        return;
      }
      // Note [Point-to-point progress]: posted; it finishes on its lane.
      current_->Defer(nullptr);
      std::shared_ptr<QueuedWork> work = current_->shared_from_this();
      if (has_send) {
        lanes_->Add(P2pLanes::SendLane(dst), std::move(work), [this, out_buf, out] {
          return Guarded([&] { out_buf->WaitSend(timeout_); });
        });
        return;
      }
      lanes_->Add(P2pLanes::RecvLane(src), std::move(work), [this, in_buf, in, recv]() mutable {
        return Guarded([&] {
          in_buf->WaitRecv(timeout_);
          if (!in.is_same(recv)) recv.copy_(in);
        });
      });
    };
    return queue_->IssuePointToPoint(std::move(fp), has_send ? dst : -1, has_recv ? src : -1,
                                     std::move(body));
  }

  std::shared_ptr<Work> Issue(Fingerprint fp, bool collective, std::function<void(uint32_t)> run) {
    return queue_->Issue(std::move(fp), collective, std::move(run));
  }

  absl::Status Execute(QueuedWork& work) {
    current_ = &work;
    absl::Status status = Guarded([&work] { work.RunBody(); });
    current_ = nullptr;
    return Described(work, status);
  }

  // `status` with the op named, for an error.
  absl::Status Described(const QueuedWork& work, const absl::Status& status) const {
    if (status.ok()) return status;
    return absl::Status(status.code(),
                        absl::StrCat("op #", work.seq(), " (", work.fingerprint().ToString(),
                                     ") on rank ", options_.rank, "/", options_.size, " ",
                                     status.message()));
  }

  // Runs `body` and turns what it throws into a Status.
  absl::Status Guarded(const std::function<void()>& body) const {
    try {
      body();
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      const std::string msg = e.what();
      if (absl::StrContains(msg, "Timed out") || absl::StrContains(msg, "timed out")) {
        return absl::DeadlineExceededError(absl::StrCat(
            "exceeded the op timeout of ", absl::FormatDuration(options_.op_timeout), ": ", msg));
      }
      return absl::UnavailableError(absl::StrCat("failed: a peer is gone or unreachable: ", msg));
    } catch (const gloo::Exception& e) {
      return absl::InternalError(absl::StrCat("failed in gloo: ", e.what()));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("failed in LibTorch: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("failed: ", e.what()));
    }
  }

  const GlooOptions options_;
  std::unique_ptr<Store> owned_store_;
  Store& store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  const std::vector<int> group_;
  const std::chrono::milliseconds timeout_;
  FlightRecorder recorder_;

  AbortHandle abort_;

  // Touched only by the op thread.
  std::vector<uint64_t> send_counts_;
  std::vector<uint64_t> recv_counts_;
  std::vector<char> scratch_;

  GroupCache groups_;

  // Null when the ranks are on different hosts or shared memory is off.
  std::unique_ptr<ShmAllreduce> shm_;
  const bool measure_transport_;
  TransportTuner tuner_;  // touched only by the op thread

  std::unique_ptr<OpQueue> queue_;
  QueuedWork* current_ = nullptr;  // the op thread's op, while its body runs
  // Last member: its threads stop (their waits woken by Abort) before
  // anything they use is destroyed; they finish ops through queue_.
  std::unique_ptr<P2pLanes> lanes_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                                     Store& store) {
  return GlooCommunicator::Create(options, store, nullptr, {}, nullptr);
}

}  // namespace chorus
