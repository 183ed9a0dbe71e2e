// Fuzz target: the coordinator's key-value store service (StoreService over
// a KeyValueStore) driven by serialized request protos, as a rank (or
// anyone who reaches the port) sends them.
//
// Input: records [op: 1 byte][length: u16][serialized request], op % 4
// choosing Set, Get, Wait or Add (StoreSetRequest, StoreGetRequest,
// StoreWaitRequest, StoreAddRequest). Set, Add and Get without a wait are
// answered before the next record; Get and Wait with a wait are left
// pending (asynchronous calls) while later records run, and cancelled at
// the end. The service runs in-process (an in-process gRPC channel), once
// per process; each input's namespaces are its own (a per-input prefix on
// every non-empty namespace).
//
// A model of the store (what was set) predicts every answer:
//   - Set: OK iff ns and key are non-empty (the value is small here);
//   - Add: the sum, INVALID_ARGUMENT on a non-integer value, OUT_OF_RANGE
//     when the sum does not fit in 64 bits; never a wrapped value;
//   - Get without wait: the model's value, or NOT_FOUND;
//   - a wait that ended OK: every key it named is set (and a Get's value is
//     one that was set for its key); pending waits end when cancelled.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "coordinator/service/store_service.h"
#include "coordinator/state/key_value_store.h"
#include "fuzz/fuzz_input.h"

namespace chorus {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "store_service_fuzzer: %s\n", what.c_str());
  std::abort();
}

struct Service {
  KeyValueStore store;
  StoreServiceImpl service{store};
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::StoreService::Stub> stub;
  int64_t inputs = 0;
};

Service& TheService() {
  static Service* const s = [] {
    auto* s = new Service;
    grpc::ServerBuilder builder;
    builder.RegisterService(&s->service);
    s->server = builder.BuildAndStart();
    if (s->server == nullptr) Fail("cannot start the in-process server");
    s->stub = v1::StoreService::NewStub(s->server->InProcessChannel(grpc::ChannelArguments()));
    return s;
  }();
  return *s;
}

void Bound(grpc::ClientContext& context, int seconds) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

// A call left waiting in the store.
struct PendingWait {
  grpc::ClientContext context;
  std::string ns;
  std::vector<std::string> keys;
  bool is_get = false;
  v1::StoreGetRequest get;
  v1::StoreGetResponse get_response;
  v1::StoreWaitRequest wait;
  v1::StoreWaitResponse wait_response;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  grpc::Status status ABSL_GUARDED_BY(mu);
  void Finish(grpc::Status s) {
    absl::MutexLock lock(&mu);
    status = std::move(s);
    done = true;
  }
};

using Model = std::map<std::pair<std::string, std::string>, std::vector<std::string>>;

std::string Latest(const Model& model, const std::string& ns, const std::string& key) {
  auto it = model.find({ns, key});
  return it == model.end() ? std::string() : it->second.back();
}

// One input's records against the service, each answer checked against a
// model of the store (the header says what is checked).
class InputRun {
 public:
  explicit InputRun(Service& service)
      : s_(service), prefix_(absl::StrCat("in", s_.inputs++, ":")) {}

  void Run(FuzzInput& in) {
    while (!in.empty()) {
      const uint8_t op = in.Byte() % 4;
      const std::string bytes = in.Bytes(in.U16());
      if (op == 0) {
        Set(bytes);
      } else if (op == 3) {
        Add(bytes);
      } else if (op == 1) {
        Get(bytes);
      } else {
        StartWait(bytes);
      }
    }
    CheckPendingWaits();
  }

 private:
  // This input's own namespace for `ns` (empty stays empty).
  std::string Scoped(const std::string& ns) const { return ns.empty() ? ns : prefix_ + ns; }

  void Set(const std::string& bytes) {
    v1::StoreSetRequest request;
    if (!request.ParseFromString(bytes)) return;
    request.set_ns(Scoped(request.ns()));
    grpc::ClientContext context;
    Bound(context, 20);
    v1::StoreSetResponse response;
    const grpc::Status status = s_.stub->Set(&context, request, &response);
    const bool valid = !request.ns().empty() && !request.key().empty();
    if (status.ok() != valid) Fail("Set answered " + status.error_message());
    if (valid) model_[{request.ns(), request.key()}].push_back(request.value());
  }

  void Add(const std::string& bytes) {
    v1::StoreAddRequest request;
    if (!request.ParseFromString(bytes)) return;
    request.set_ns(Scoped(request.ns()));
    grpc::ClientContext context;
    Bound(context, 20);
    v1::StoreAddResponse response;
    const grpc::Status status = s_.stub->Add(&context, request, &response);
    if (request.ns().empty() || request.key().empty()) {
      if (status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
        Fail("Add without ns or key answered " + status.error_message());
      }
      return;
    }
    const auto key = std::make_pair(request.ns(), request.key());
    int64_t before = 0;
    if (model_.count(key) && !absl::SimpleAtoi(Latest(model_, key.first, key.second), &before)) {
      if (status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
        Fail("Add on a non-integer answered " + status.error_message());
      }
      return;
    }
    const auto answered = [&] {
      return absl::StrCat(
          "Add of ", request.delta(), " to ", before, " answered ",
          status.ok() ? absl::StrCat("OK ", response.value()) : status.error_message());
    };
    int64_t sum = 0;
    if (__builtin_add_overflow(before, request.delta(), &sum)) {
      if (status.error_code() != grpc::StatusCode::OUT_OF_RANGE) Fail(answered());
      return;
    }
    if (!status.ok() || response.value() != sum) Fail(answered());
    model_[key].push_back(std::to_string(sum));
  }

  // A Get without a wait is answered now; with one it is left pending.
  void Get(const std::string& bytes) {
    auto w = std::make_unique<PendingWait>();
    if (!w->get.ParseFromString(bytes)) return;
    w->get.set_ns(Scoped(w->get.ns()));
    w->is_get = true;
    w->ns = w->get.ns();
    w->keys = {w->get.key()};
    // wait_seconds != wait_seconds: NaN, which the service must refuse.
    if (w->get.wait_seconds() == 0 || w->get.wait_seconds() != w->get.wait_seconds()) {
      CheckGetNow(w->get);
      return;
    }
    Bound(w->context, 20);
    PendingWait* p = w.get();
    s_.stub->async()->Get(&p->context, &p->get, &p->get_response,
                          [p](grpc::Status st) { p->Finish(std::move(st)); });
    pending_.push_back(std::move(w));
  }

  void CheckGetNow(const v1::StoreGetRequest& get) {
    grpc::ClientContext context;
    Bound(context, 20);
    v1::StoreGetResponse response;
    const grpc::Status status = s_.stub->Get(&context, get, &response);
    if (get.ns().empty() || get.key().empty() || get.wait_seconds() != 0) {
      if (status.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
        Fail("a bad Get answered " + status.error_message());
      }
    } else if (model_.count({get.ns(), get.key()})) {
      if (!status.ok() || response.value() != Latest(model_, get.ns(), get.key())) {
        Fail("Get of a set key answered " + status.error_message());
      }
    } else if (status.error_code() != grpc::StatusCode::NOT_FOUND) {
      Fail("Get of an unset key answered " + status.error_message());
    }
  }

  void StartWait(const std::string& bytes) {
    auto w = std::make_unique<PendingWait>();
    if (!w->wait.ParseFromString(bytes)) return;
    w->wait.set_ns(Scoped(w->wait.ns()));
    w->ns = w->wait.ns();
    w->keys.assign(w->wait.keys().begin(), w->wait.keys().end());
    Bound(w->context, 20);
    PendingWait* p = w.get();
    s_.stub->async()->Wait(&p->context, &p->wait, &p->wait_response,
                           [p](grpc::Status st) { p->Finish(std::move(st)); });
    pending_.push_back(std::move(w));
  }

  // Cancels every pending call; each must end, and one that ended OK must
  // have seen what was set.
  void CheckPendingWaits() {
    for (auto& w : pending_) w->context.TryCancel();
    for (auto& w : pending_) {
      absl::MutexLock lock(&w->mu);
      if (!w->mu.AwaitWithTimeout(absl::Condition(&w->done), absl::Seconds(30))) {
        Fail("a cancelled wait never ended");
      }
      if (!w->status.ok()) continue;
      for (const std::string& key : w->keys) {
        if (!model_.count({w->ns, key})) Fail("a wait ended OK on a key nobody set: " + key);
      }
      if (w->is_get) {
        const std::vector<std::string>& values = model_[{w->ns, w->get.key()}];
        if (std::find(values.begin(), values.end(), w->get_response.value()) == values.end()) {
          Fail("a waiting Get answered a value nobody set");
        }
      }
    }
  }

  Service& s_;
  const std::string prefix_;
  Model model_;  // every value set per (ns, key), in order
  std::vector<std::unique_ptr<PendingWait>> pending_;
};

}  // namespace
}  // namespace chorus

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorus::FuzzInput in(data, size);
  chorus::InputRun(chorus::TheService()).Run(in);
  return 0;
}
