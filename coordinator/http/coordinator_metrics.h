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
//   scheduler.reads().Snapshot(snapshot);
//   std::string text = metrics.Render(snapshot);  // GET /metrics
#ifndef CHORUS_COORDINATOR_HTTP_COORDINATOR_METRICS_H_
#define CHORUS_COORDINATOR_HTTP_COORDINATOR_METRICS_H_

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
#include "prometheus/metric_family.h"
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
  // What each user ("" the anonymous user) has: every owner of a running
  // or queued job, and every owner with fair-share usage left.
  struct User {
    std::map<v1::ResourceSpec::Device, int64_t> slots_in_use;
    int64_t running_jobs = 0;
    int64_t queued_jobs = 0;
    double fair_share_slot_seconds = 0;  // decayed (FairShare::usage)
  };
  std::map<std::string, User> users;
  // Queued jobs by why they wait (WaitClassName in queue_plan.h: quota,
  // free_slots, reservation, no_agent; each present, 0 included).
  std::map<std::string, int64_t> queued_by_wait;
  // The newest failed jobs, newest end first (JobManager::NewestFailed):
  // at most CoordinatorMetrics::max_failed_series() of them.
  std::vector<v1::Job> failed;
};

// A gauge family rebuilt from the snapshot at every render: a render writes
// only the series set during it, so a job that ended or a rank that left a
// phase is gone from the next scrape with no bookkeeping. The family is
// built directly in prometheus-cpp's data model (no Gauge objects, no
// registry lookups), which keeps a scrape of a thousand ranks cheap
// (Note [Scrape cost] in coordinator_metrics.cc).
class StateGauge {
 public:
  StateGauge(std::string name, std::string help);
  // Adds one series; `labels` in any order.
  void Set(std::vector<prometheus::ClientMetric::Label> labels, double value);
  // This render's family; leaves the gauge empty for the next render.
  prometheus::MetricFamily Take();

 private:
  prometheus::MetricFamily family_;
};

class CoordinatorMetrics {
 public:
  // Per-rank series of a job with at most this many ranks by default
  // (Note [Per-rank series at scale] in coordinator_metrics.cc).
  static constexpr int kDefaultMaxRankSeries = 1024;
  // Users with their own series by default (Note [User series]).
  static constexpr int kDefaultMaxUserSeries = 100;
  // Failed jobs whose reason is a series by default (Note [Failure reasons
  // as labels]).
  static constexpr int kDefaultMaxFailedSeries = 20;

  // A running job with more than `max_rank_series` ranks gets its ranks'
  // summary series instead of one series per rank (the ranks a diagnosis
  // names keep theirs).
  // Beyond `max_user_series` users, the users who hold the fewest slots are
  // summed into the series of user "(others)". The newest
  // `max_failed_series` failed jobs have a series carrying their reason.
  explicit CoordinatorMetrics(int max_rank_series = kDefaultMaxRankSeries,
                              int max_user_series = kDefaultMaxUserSeries,
                              int max_failed_series = kDefaultMaxFailedSeries);
  int max_rank_series() const { return max_rank_series_; }
  int max_failed_series() const { return max_failed_series_; }
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // A generation of a job began; `cause`: "start" (a new job placed),
  // "recovered" (a running job taken back after a coordinator restart), or
  // for an elastic job the ReformKindName of its change (elastic_state.h).
  void GenerationStarted(const std::string& cause);
  // Every rank of a generation joined, `took` after its ranks were launched.
  void RendezvousCompleted(absl::Duration took);
  // A rank's join reached the scheduler: `via` "agent" (one of the joins
  // in an agent's RankJoins) or "rank" (the rank's own RankService.Join).
  void RankJoined(const std::string& via);
  // A diagnosis appeared (counted once per problem, not per tick).
  void DiagnosisSeen(v1::Diagnosis::Kind kind);
  // A gRPC call ended: its full method name, status code name and duration
  // (for streams, how long the stream lasted).
  void RpcFinished(const std::string& method, const std::string& code, absl::Duration duration);

  // Sets the state gauges from `snapshot` and returns every metric in the
  // Prometheus text format (version 0.0.4).
  std::string Render(const ClusterSnapshot& snapshot);

 private:
  // Render's parts: the cluster's gauges (jobs, agents, slots), one running
  // job's and its ranks'.
  void SetClusterLocked(const ClusterSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  void SetJobLocked(const v1::JobStatus& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  void SetRanksLocked(const v1::JobStatus& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  // The users' gauges and the queue's by wait class.
  void SetUsersLocked(const ClusterSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  // The newest failed jobs' reasons.
  void SetFailedLocked(const ClusterSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  // The constructor's parts: the state gauges of the cluster, of a running
  // job, of its ranks, and of its ranks' summary.
  void AddClusterGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  void AddJobGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  void AddRankGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
  void AddRankSummaryGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);

  const int max_rank_series_;
  const int max_user_series_;
  const int max_failed_series_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& generations_;
  prometheus::Family<prometheus::Histogram>& rendezvous_;
  prometheus::Family<prometheus::Counter>& rank_joins_;
  prometheus::Family<prometheus::Counter>& diagnoses_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& jobs_finished_;

  absl::Mutex render_mu_;
  // Terminal-state counts already added to jobs_finished_.
  std::map<v1::Job::State, int64_t> finished_counted_ ABSL_GUARDED_BY(render_mu_);
  // State gauges, in the order they are written.
  std::vector<std::unique_ptr<StateGauge>> all_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* jobs_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* agents_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* slots_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* queued_by_wait_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* user_slots_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* user_jobs_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* user_fair_share_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* user_series_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_failed_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_progress_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_step_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_samples_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_eta_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_loss_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_diagnoses_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* checkpoint_bytes_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* checkpoint_stall_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* checkpoint_store_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* data_wait_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* data_read_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_step_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_samples_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_step_seconds_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_compute_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_wait_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_caused_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_phase_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_phase_seconds_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_heartbeat_age_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_loss_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* rank_diagnosed_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_ranks_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_rank_series_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_min_step_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_heartbeat_age_ ABSL_GUARDED_BY(render_mu_);
  StateGauge* job_caused_ ABSL_GUARDED_BY(render_mu_);

  StateGauge* AddGauge(const std::string& name, const std::string& help)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_);
};

// The user's name as labels show it: "anonymous" for "".
std::string UserLabel(const std::string& owner);
// The label value of the users beyond the cap (not a valid user name).
inline constexpr char kOtherUsersLabel[] = "(others)";

// The device's name as labels show it ("CPU", "CUDA").
std::string DeviceName(v1::ResourceSpec::Device device);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HTTP_COORDINATOR_METRICS_H_
