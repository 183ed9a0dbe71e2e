// chorus._C: the Python package's native half (docs/python.md). It wraps
// the C++ SDK's Session (sdk/session.h) for a PyTorch script run as a
// `program` job, and makes the `chorus` process group
// (CommunicatorProcessGroup) that chorus/__init__.py registers with
// torch.distributed. Every call that can block (joining, collectives,
// checkpoints) releases the GIL.
//
// Errors: an absl::Status that is not OK is raised as chorus.Error (a
// RuntimeError) whose message starts with the status code, as
// "UNAVAILABLE: ..." — the code is what chorus.membership_lost() reads.
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "chorus/elastic.h"
#include "chorus/session.h"
#include "pybind11/stl.h"
#include "python/process_group.h"

namespace py = pybind11;

namespace chorus {
namespace {

class StatusError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void RaiseIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status.ToString());
}

template <typename T>
T ValueOrRaise(absl::StatusOr<T> value) {
  RaiseIfError(value.status());
  return *std::move(value);
}

using TensorList = std::vector<std::pair<std::string, at::Tensor>>;

std::vector<NamedTensor> Named(const TensorList& list) {
  std::vector<NamedTensor> named;
  named.reserve(list.size());
  for (const auto& [name, tensor] : list) named.push_back({name, tensor});
  return named;
}

v1::Phase PhaseNamed(const std::string& name) {
  v1::Phase phase;
  const std::string upper = absl::AsciiStrToUpper(name);
  // PHASE_UNSPECIFIED too: what a phase() block returns to after setup.
  if (!v1::Phase_Parse(upper, &phase)) {
    std::vector<std::string> names;
    for (int p = v1::SETUP; p <= v1::FINISHED; ++p) {
      names.push_back(v1::Phase_Name(static_cast<v1::Phase>(p)));
    }
    throw StatusError(absl::StrCat("INVALID_ARGUMENT: unknown phase '", name, "'; one of ",
                                   absl::StrJoin(names, ", ")));
  }
  return phase;
}

std::shared_ptr<Session> FromEnvironment(double connect_timeout_seconds) {
  SessionOptions options;
  options.connect_timeout = absl::Seconds(connect_timeout_seconds);
  absl::StatusOr<std::unique_ptr<Session>> session;
  {
    py::gil_scoped_release release;
    session = Session::FromEnvironment(options);
  }
  return std::shared_ptr<Session>(ValueOrRaise(std::move(session)));
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupOf(const std::shared_ptr<Session>& session,
                                                      int rank, int world_size) {
  if (rank != session->rank() || world_size != session->world_size()) {
    throw StatusError(absl::StrCat(
        "INVALID_ARGUMENT: init_process_group(rank=", rank, ", world_size=", world_size,
        ") does not match this Chorus rank (rank ", session->rank(), " of ",
        session->world_size(), ", generation ", session->generation(),
        "); call chorus.init_process_group(), or pass no rank and world_size"));
  }
  // The rank's setup is over once its process group exists: SETUP is a
  // declared pause that the hang detector excuses (for up to
  // hang_detection.phase_limit_seconds), and a script that marks no phases
  // of its own would stay in it.
  ProgressReporter& progress = session->progress();
  const v1::Phase before = progress.EnterPhase(v1::PHASE_UNSPECIFIED);
  if (before != v1::SETUP) progress.EnterPhase(before);
  return c10::make_intrusive<CommunicatorProcessGroup>(session->shared_communicator(), &progress,
                                                       session);
}

void BindSession(py::module_& m) {
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def_static("from_environment", &FromEnvironment,
                  py::arg("connect_timeout_seconds") = 120.0)
      .def_property_readonly("rank", &Session::rank)
      .def_property_readonly("world_size", &Session::world_size)
      .def_property_readonly("local_rank", &Session::local_rank)
      .def_property_readonly("local_world_size", &Session::local_world_size)
      .def_property_readonly("generation", &Session::generation)
      .def_property_readonly("job_id", &Session::job_id)
      .def_property_readonly("resuming", &Session::resuming)
      .def_property_readonly("elastic", &Session::elastic)
      .def_property_readonly("device", [](Session& s) { return s.device().str(); })
      .def("process_group", &ProcessGroupOf, py::arg("rank"), py::arg("world_size"))
      .def("torch_store",
           [](const std::shared_ptr<Session>& s) -> c10::intrusive_ptr<c10d::Store> {
             return c10::make_intrusive<TorchStore>(s->store(), s);
           })
      .def("step", &Session::Step, py::arg("step"), py::arg("loss"), py::arg("samples"))
      .def("set_epoch", [](Session& s, int64_t epoch) { s.progress().SetEpoch(epoch); })
      .def("enter_phase",
           [](Session& s, const std::string& name) {
             return v1::Phase_Name(s.progress().EnterPhase(PhaseNamed(name)));
           })
      .def("flush_progress", [](Session& s) { s.progress().Flush(); })
      .def("checkpoint_requested", &Session::CheckpointRequested)
      .def("save_checkpoint",
           [](Session& s, int64_t step, const TensorList& tensors) {
             std::vector<NamedTensor> named = Named(tensors);
             py::gil_scoped_release release;
             RaiseIfError(s.SaveCheckpoint(step, named));
           })
      .def("store_checkpoint_copy",
           [](Session& s, int64_t step, const TensorList& copies) {
             std::vector<NamedTensor> named = Named(copies);
             py::gil_scoped_release release;
             RaiseIfError(s.StoreCheckpointCopy(step, named));
           })
      .def("restore_checkpoint",
           [](Session& s, const TensorList& into) {
             std::vector<NamedTensor> named = Named(into);
             py::gil_scoped_release release;
             return ValueOrRaise(s.RestoreCheckpoint(named));
           })
      .def("load_checkpoint",
           [](Session& s) {
             absl::StatusOr<TensorCheckpoints::Loaded> loaded;
             {
               py::gil_scoped_release release;
               loaded = s.LoadCheckpoint();
             }
             TensorCheckpoints::Loaded value = ValueOrRaise(std::move(loaded));
             TensorList tensors;
             for (NamedTensor& t : value.tensors) tensors.emplace_back(t.name, t.tensor);
             return std::make_pair(value.step, tensors);
           })
      .def("reform_requested",
           [](Session& s) {
             py::gil_scoped_release release;
             return ValueOrRaise(s.ReformRequested());
           })
      .def("join_next_generation",
           [](Session& s, const std::string& why) {
             absl::Status cause = why.empty() ? absl::OkStatus() : absl::UnavailableError(why);
             py::gil_scoped_release release;
             return ValueOrRaise(s.JoinNextGeneration(cause));
           })
      .def("share_newest_state",
           [](Session& s, int64_t held_step, const TensorList& tensors) {
             std::vector<NamedTensor> named = Named(tensors);
             py::gil_scoped_release release;
             SharedTensors shared = ValueOrRaise(s.ShareNewestState(held_step, named));
             return std::make_tuple(shared.step, shared.source, shared.bytes);
           })
      .def("average_held_state", [](Session& s, bool held, const TensorList& tensors) {
        std::vector<NamedTensor> named = Named(tensors);
        py::gil_scoped_release release;
        return ValueOrRaise(s.AverageHeldState(held, named));
      });
}

}  // namespace
}  // namespace chorus

PYBIND11_MODULE(_C, m) {
  // The process group's Python type comes from torch.distributed's own
  // module; it must be loaded before a group is returned.
  py::module_::import("torch.distributed");
  m.doc() = "The native half of the chorus package (docs/python.md).";
  py::register_exception<chorus::StatusError>(m, "Error", PyExc_RuntimeError);
  chorus::BindSession(m);
}
