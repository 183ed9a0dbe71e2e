// CoordinatorMetrics: the coordinator's Prometheus metrics (docs/observability.md
// has the table), kept in a prometheus-cpp registry and written in the text
// exposition format.
//
// Two kinds of figures:
//   - events, counted as they happen from any thread (a generation formed,
//     a diagnosis first seen, an RPC finished): counters and histograms;
//   - state, read at each scrape from a ClusterSnapshot (jobs by state,
//     agents and slots, every running job's ranks): gauges. A series whose
//     labels are not in the snapshot any more (a job that ended, a rank
//     that left a phase) is removed, so per-rank series of a finished job
//     disappear from the next scrape.
//
// Thread-safety: every method may be called concurrently; Render() calls
// are serialized.
//
// Example:
//   CoordinatorMetrics metrics;
//   metrics.GenerationStarted("start");
//   metrics.RendezvousCompleted(absl::Seconds(2));
//   ClusterSnapshot snapshot;
//   snapshot.jobs_by_state = jobs.CountByState();
//   scheduler.Snapshot(snapshot);
//   std::string text = metrics.Render(snapshot);  // GET /metrics
#ifndef CHORUS_COORDINATOR_COORDINATOR_METRICS_H_
#define CHORUS_COORDINATOR_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace chorus {

// What the coordinator looks like at one instant.
struct ClusterSnapshot {
  std::map<v1::Job::State, int64_t> jobs_by_state;
  int agents = 0;
  struct Slots {
    int64_t free = 0;
    int64_t used = 0;
  };
  std::map<v1::ResourceSpec::Device, Slots> slots_by_device;
  // One per running job: job (id, spec name, latest metrics), a row per
  // rank, the diagnoses that hold now.
  std::vector<v1::JobStatus> running;
};

// A set of gauge series rebuilt at every render: series set during the
// render stay, the others are removed at its end. Series are found by a
// flat key of their labels and marked with the render they were last set
// in, so a render of N series costs N hash lookups.
class GaugeSeries {
 public:
  explicit GaugeSeries(prometheus::Family<prometheus::Gauge>& family) : family_(family) {}
  void Begin() { ++render_; }
  void Set(const std::map<std::string, std::string>& labels, double value);
  void End();

 private:
  struct Live {
    prometheus::Gauge* gauge = nullptr;
    uint64_t render = 0;
  };
  prometheus::Family<prometheus::Gauge>& family_;
  std::unordered_map<std::string, Live> live_;
  uint64_t render_ = 0;
};

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // A generation of a job began; `cause`: "start" (a new job placed),
  // "recovered" (a running job taken back after a coordinator restart), or
  // for an elastic job "rank_lost", "agent_lost", "drain", "scale_up".
  void GenerationStarted(const std::string& cause);
  // Every rank of a generation joined, `took` after its ranks were launched.
  void RendezvousCompleted(absl::Duration took);
  // A diagnosis appeared (counted once per problem, not per tick).
  void DiagnosisSeen(v1::Diagnosis::Kind kind);
  // A gRPC call ended: its full method name, status code name and duration
  // (for streams, how long the stream lasted).
  void RpcFinished(const std::string& method, const std::string& code, absl::Duration duration);

  // Sets the state gauges from `snapshot` and returns every metric in the
  // Prometheus text format (version 0.0.4).
  std::string Render(const ClusterSnapshot& snapshot);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& generations_;
  prometheus::Family<prometheus::Histogram>& rendezvous_;
  prometheus::Family<prometheus::Counter>& diagnoses_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& jobs_finished_;

  absl::Mutex render_mu_;
  // Terminal-state counts already added to jobs_finished_.
  std::map<v1::Job::State, int64_t> finished_counted_ ABSL_GUARDED_BY(render_mu_);
  // State gauges.
  std::vector<std::unique_ptr<GaugeSeries>> all_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* jobs_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* agents_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* slots_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* job_progress_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* job_step_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* job_samples_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* job_eta_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* job_loss_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* job_diagnoses_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* checkpoint_bytes_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* checkpoint_stall_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* checkpoint_store_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_step_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_samples_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_step_seconds_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_compute_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_wait_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_caused_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_phase_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_phase_seconds_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_heartbeat_age_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_loss_ ABSL_GUARDED_BY(render_mu_);
  GaugeSeries* rank_diagnosed_ ABSL_GUARDED_BY(render_mu_);

  GaugeSeries* AddGauge(const std::string& name, const std::string& help)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
};

// The device's name as labels show it ("CPU", "CUDA").
std::string DeviceName(v1::ResourceSpec::Device device);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_COORDINATOR_METRICS_H_
