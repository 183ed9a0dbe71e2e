#include "coordinator/http/coordinator_metrics.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace chorus {
namespace {

// Seconds: from a fast local rendezvous to one that waits for slow starts.
const prometheus::Histogram::BucketBoundaries kRendezvousBuckets = {0.1, 0.25, 0.5, 1,  2,
                                                                    5,   10,   30,  60, 300};
// Seconds: unary calls take microseconds to milliseconds; streams (heartbeats,
// agent connections, checkpoint uploads) last as long as the job.
const prometheus::Histogram::BucketBoundaries kRpcBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60, 600, 3600};

double Value(const v1::Metrics& metrics, const std::string& name, double otherwise) {
  auto it = metrics.values().find(name);
  return it != metrics.values().end() ? it->second : otherwise;
}

}  // namespace

std::string UserLabel(const std::string& owner) { return owner.empty() ? "anonymous" : owner; }

std::string DeviceName(v1::ResourceSpec::Device device) {
  return device == v1::ResourceSpec::DEVICE_UNSPECIFIED ? "CPU"
                                                        : v1::ResourceSpec::Device_Name(device);
}

// Note [Scrape cost]
// A scrape of a coordinator with a 1024-rank job writes ~11,000 series
// (~790 KB). Keeping them as prometheus-cpp Gauge objects cost three passes
// per series at every scrape: setting each through a label-keyed lookup,
// the registry's Collect copying every series' labels out again, and the
// text serializer. The state gauges now build the collected form
// (MetricFamily) straight from the snapshot, which leaves the serializer
// as the main cost. Counters and histograms, updated by events between
// scrapes, stay in the registry.

StateGauge::StateGauge(std::string name, std::string help) {
  family_.name = std::move(name);
  family_.help = std::move(help);
  family_.type = prometheus::MetricType::Gauge;
}

void StateGauge::Set(std::vector<prometheus::ClientMetric::Label> labels, double value) {
  // The exposition lists a series' labels by name, as the registry does.
  std::sort(labels.begin(), labels.end());
  prometheus::ClientMetric& metric = family_.metric.emplace_back();
  metric.label = std::move(labels);
  metric.gauge.value = value;
}

prometheus::MetricFamily StateGauge::Take() {
  prometheus::MetricFamily taken;
  taken.name = family_.name;
  taken.help = family_.help;
  taken.type = family_.type;
  taken.metric.swap(family_.metric);
  return taken;
}

// Note [Per-rank series at scale]
// Ten series per rank make a scrape of a 16,384-rank job 12.8 MB (p99 0.7 s
// on two cores, docs/benchmarks.md), more than Prometheus should keep for
// one job. A job with more ranks than --metrics_max_rank_series (1,024 by
// default) gets a few summary series instead (chorus_job_ranks by state,
// the lowest step, the oldest heartbeat, the longest wait the others had
// for one rank), written for every running job; the ranks a diagnosis names
// keep their per-rank series, so an alert can still say which rank. Every
// rank stays in the job page and `chorus status`, paged.

// Note [User series]
// Four series per user (slots per device, running and queued jobs, fair-share
// usage) would let a coordinator with thousands of token-file users, or of
// anonymous-but-named submitters, grow a scrape without bound. At most
// --metrics_max_user_series users (100 by default) get their own series:
// those holding the most slots, then those with the most fair-share usage,
// then the most queued jobs, then by name. The rest are summed into the
// series of user "(others)" (parentheses cannot be in a user name), so the
// totals over `user` stay right; chorus_user_series says how many users
// there are and how many have series. The status page and `chorus queue`
// list every user.

// Note [Failure reasons as labels]
// A failed job's reason says what went wrong in the rank's own words (its
// last error record: file, offset, sample; Note [Rank error record] in
// common/output_limits.h), and an alert on a failure should be able to
// carry it. A label of free text on every job ever failed would grow a
// scrape without end, so only the newest --metrics_max_failed_series failed
// jobs held in memory (20 by default) have a series,
// chorus_job_failed_timestamp_seconds{job, user, reason}, valued at the
// time they failed. The reason is the job's as `chorus status` shows it,
// which JobManager bounds (kMaxReasonBytes, 4 KiB). An alert fires on a new
// series and quotes its reason label; `chorus status` and the page have
// every job.

CoordinatorMetrics::CoordinatorMetrics(int max_rank_series, int max_user_series,
                                       int max_failed_series)
    : max_rank_series_(max_rank_series),
      max_user_series_(max_user_series),
      max_failed_series_(max_failed_series),
      registry_(std::make_shared<prometheus::Registry>()),
      generations_(prometheus::BuildCounter()
                       .Name("chorus_generations_total")
                       .Help("Generations begun, by cause: start (a new job placed), "
                             "recovered (taken back after a coordinator restart), and for "
                             "elastic jobs rank_lost, agent_lost, hang_restart, drain, "
                             "scale_up.")
                       .Register(*registry_)),
      rendezvous_(prometheus::BuildHistogram()
                      .Name("chorus_rendezvous_seconds")
                      .Help("From a generation's start (ranks launched) until every rank joined.")
                      .Register(*registry_)),
      rank_joins_(prometheus::BuildCounter()
                      .Name("chorus_rank_joins_total")
                      .Help("Ranks' joins received, by the way they came: agent (in a node "
                            "agent's RankJoins) or rank (the rank's own RankService.Join).")
                      .Register(*registry_)),
      diagnoses_(prometheus::BuildCounter()
                     .Name("chorus_diagnoses_total")
                     .Help("Hang and straggler diagnoses, counted when first seen, by kind.")
                     .Register(*registry_)),
      rpcs_(prometheus::BuildCounter()
                .Name("chorus_rpcs_total")
                .Help("gRPC calls served, by full method name and status code.")
                .Register(*registry_)),
      rpc_seconds_(prometheus::BuildHistogram()
                       .Name("chorus_rpc_seconds")
                       .Help("gRPC call durations by method (a stream: how long it lasted).")
                       .Register(*registry_)),
      jobs_finished_(prometheus::BuildCounter()
                         .Name("chorus_jobs_finished_total")
                         .Help("Jobs that ended, by final state (all jobs of the state directory).")
                         .Register(*registry_)) {
  // Both ways from the start: a scrape shows via="rank" 0, not nothing, on a
  // cluster whose agents carry every join.
  rank_joins_.Add({{"via", "agent"}});
  rank_joins_.Add({{"via", "rank"}});
  absl::MutexLock lock(&render_mu_);
  // The order here is the order of the exposition.
  AddClusterGaugesLocked();
  AddJobGaugesLocked();
  AddRankGaugesLocked();
  AddRankSummaryGaugesLocked();
}

void CoordinatorMetrics::AddClusterGaugesLocked() {
  jobs_ = AddGauge("chorus_jobs", "Jobs by state.");
  agents_ = AddGauge("chorus_agents_connected", "Node agents connected.");
  slots_ = AddGauge("chorus_slots", "Slots of the connected agents by device, free or used.");
  queued_by_wait_ =
      AddGauge("chorus_queued_jobs",
               "Queued jobs by why they wait (label reason: quota, free_slots (first in line, "
               "holding the reservation), reservation (behind the holder), no_agent).");
  user_slots_ = AddGauge("chorus_user_slots",
                         "Slots a user's running jobs hold, by device (label user; \"anonymous\" "
                         "for no user, \"(others)\" past --metrics_max_user_series).");
  user_jobs_ = AddGauge("chorus_user_jobs", "A user's jobs by state (running, queued).");
  user_fair_share_ =
      AddGauge("chorus_user_fair_share_slot_seconds",
               "A user's decayed usage in slot-seconds, which orders the queue within a priority.");
  user_series_ = AddGauge("chorus_user_series",
                          "Users known now (state=\"all\") and those with their own series "
                          "(state=\"own\"; at most --metrics_max_user_series).");
  job_failed_ = AddGauge(
      "chorus_job_failed_timestamp_seconds",
      "When a failed job failed (Unix seconds), with its reason as `chorus status` shows it "
      "(label reason); the newest --metrics_max_failed_series failed jobs only.");
}

void CoordinatorMetrics::AddJobGaugesLocked() {
  job_step_ = AddGauge("chorus_job_step", "A running job's step (its furthest rank's).");
  job_progress_ =
      AddGauge("chorus_job_progress_ratio",
               "A running job's step over its total steps (0 to 1); absent until rank 0 has "
               "reported its total.");
  job_eta_ =
      AddGauge("chorus_job_eta_seconds",
               "Estimated seconds until a running job's last step, at its recent step time.");
  job_samples_ = AddGauge("chorus_job_samples_per_second",
                          "A running job's throughput, all ranks (rank 0's last report).");
  job_loss_ = AddGauge("chorus_job_loss", "A running job's training loss (rank 0's last report).");
  job_diagnoses_ =
      AddGauge("chorus_job_diagnoses", "Diagnoses that hold now for a running job, by kind.");
  checkpoint_bytes_ =
      AddGauge("chorus_checkpoint_bytes", "Size of a running job's last stored checkpoint.");
  checkpoint_stall_ = AddGauge("chorus_checkpoint_stall_seconds",
                               "Training time a running job has lost waiting on checkpoints.");
  checkpoint_store_ = AddGauge("chorus_checkpoint_store_seconds",
                               "How long a running job's last checkpoint took to store.");
  data_wait_ = AddGauge("chorus_data_wait_seconds",
                        "Per step: how long a running job's step waited for its batch from "
                        "data.shards (rank 0's last report).");
  data_read_ = AddGauge("chorus_data_read_bytes_per_second",
                        "How fast a running job's rank 0 read its data.shards over its last "
                        "report window.");
}

void CoordinatorMetrics::AddRankGaugesLocked() {
  rank_step_ = AddGauge("chorus_rank_step", "A rank's step (labels job, rank, host).");
  rank_samples_ = AddGauge("chorus_rank_samples_per_second", "Samples a rank trains per second.");
  rank_step_seconds_ = AddGauge("chorus_rank_step_seconds", "A rank's time per step.");
  rank_compute_ = AddGauge("chorus_rank_compute_seconds",
                           "Per step: a rank's time computing (step time minus the wait).");
  rank_wait_ =
      AddGauge("chorus_rank_comm_wait_seconds",
               "Per step: how long a rank waited for the others in gradient synchronization.");
  rank_caused_ = AddGauge("chorus_rank_caused_wait_seconds",
                          "Per step: how long the other ranks together waited for this rank "
                          "(straggler attribution; about 0 for ranks that wait).");
  rank_phase_ = AddGauge("chorus_rank_phase",
                         "1 for the phase a rank is in (label phase), the others absent.");
  rank_phase_seconds_ =
      AddGauge("chorus_rank_phase_seconds", "How long a rank has been in its phase.");
  rank_heartbeat_age_ =
      AddGauge("chorus_rank_heartbeat_age_seconds", "Seconds since a rank's last heartbeat.");
  rank_loss_ = AddGauge("chorus_rank_loss", "A rank's mean training loss over its last window.");
  rank_diagnosed_ = AddGauge("chorus_rank_diagnosed",
                             "1 for a rank a diagnosis names as the culprit (label kind).");
}

void CoordinatorMetrics::AddRankSummaryGaugesLocked() {
  job_ranks_ = AddGauge("chorus_job_ranks", "A running job's ranks by state (label state).");
  job_rank_series_ =
      AddGauge("chorus_job_rank_series",
               "1 when a running job's per-rank series are written, 0 when it has more ranks than "
               "--metrics_max_rank_series (only the ranks a diagnosis names have theirs then).");
  job_min_step_ = AddGauge("chorus_job_rank_step_min",
                           "A running job's lowest rank step (of the ranks that sent one).");
  job_heartbeat_age_ =
      AddGauge("chorus_job_rank_heartbeat_age_max_seconds",
               "Seconds since the oldest last heartbeat of a running job's ranks.");
  job_caused_ = AddGauge("chorus_job_rank_caused_wait_max_seconds",
                         "Per step: the longest the other ranks together waited for one rank.");
}

StateGauge* CoordinatorMetrics::AddGauge(const std::string& name, const std::string& help) {
  all_.push_back(std::make_unique<StateGauge>(name, help));
  return all_.back().get();
}

void CoordinatorMetrics::GenerationStarted(const std::string& cause) {
  generations_.Add({{"cause", cause}}).Increment();
}

void CoordinatorMetrics::RankJoined(const std::string& via) {
  rank_joins_.Add({{"via", via}}).Increment();
}

void CoordinatorMetrics::RendezvousCompleted(absl::Duration took) {
  rendezvous_.Add({}, kRendezvousBuckets).Observe(absl::ToDoubleSeconds(took));
}

void CoordinatorMetrics::DiagnosisSeen(v1::Diagnosis::Kind kind) {
  diagnoses_.Add({{"kind", v1::Diagnosis::Kind_Name(kind)}}).Increment();
}

void CoordinatorMetrics::RpcFinished(const std::string& method, const std::string& code,
                                     absl::Duration duration) {
  rpcs_.Add({{"method", method}, {"code", code}}).Increment();
  rpc_seconds_.Add({{"method", method}}, kRpcBuckets).Observe(absl::ToDoubleSeconds(duration));
}

std::string CoordinatorMetrics::Render(const ClusterSnapshot& snapshot) {
  absl::MutexLock lock(&render_mu_);
  SetClusterLocked(snapshot);
  SetUsersLocked(snapshot);
  SetFailedLocked(snapshot);
  for (const v1::JobStatus& status : snapshot.running) {
    SetJobLocked(status);
    SetRanksLocked(status);
  }
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  families.reserve(families.size() + all_.size());
  for (auto& gauge : all_) {
    prometheus::MetricFamily family = gauge->Take();
    // As the registry does: a family with no series is not written.
    if (!family.metric.empty()) families.push_back(std::move(family));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

void CoordinatorMetrics::SetClusterLocked(const ClusterSnapshot& snapshot) {
  for (const auto& [state, count] : snapshot.jobs_by_state) {
    jobs_->Set({{"state", v1::Job::State_Name(state)}}, static_cast<double>(count));
    if (state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED) {
      // A counter: only what is new since the last scrape is added.
      prometheus::Counter& finished = jobs_finished_.Add({{"state", v1::Job::State_Name(state)}});
      int64_t& counted = finished_counted_[state];
      if (count > counted) {
        finished.Increment(static_cast<double>(count - counted));
        counted = count;
      }
    }
  }
  agents_->Set({}, snapshot.agents);
  for (const auto& [device, slots] : snapshot.slots_by_device) {
    slots_->Set({{"device", DeviceName(device)}, {"state", "free"}},
                static_cast<double>(slots.free));
    slots_->Set({{"device", DeviceName(device)}, {"state", "used"}},
                static_cast<double>(slots.used));
  }
}

void CoordinatorMetrics::SetUsersLocked(const ClusterSnapshot& snapshot) {
  for (const auto& [wait, count] : snapshot.queued_by_wait) {
    queued_by_wait_->Set({{"reason", wait}}, static_cast<double>(count));
  }
  using User = ClusterSnapshot::User;
  std::vector<std::pair<std::string, const User*>> users;
  std::map<std::string, int64_t> slots_held;
  for (const auto& [owner, user] : snapshot.users) {
    users.emplace_back(owner, &user);
    for (const auto& [device, slots] : user.slots_in_use) slots_held[owner] += slots;
  }
  // Note [User series]: who keeps a series of their own.
  std::sort(users.begin(), users.end(), [&](const auto& a, const auto& b) {
    const int64_t slots_a = slots_held[a.first], slots_b = slots_held[b.first];
    if (slots_a != slots_b) return slots_a > slots_b;
    if (a.second->fair_share_slot_seconds != b.second->fair_share_slot_seconds) {
      return a.second->fair_share_slot_seconds > b.second->fair_share_slot_seconds;
    }
    if (a.second->queued_jobs != b.second->queued_jobs) {
      return a.second->queued_jobs > b.second->queued_jobs;
    }
    return a.first < b.first;
  });
  const size_t own = std::min(users.size(), static_cast<size_t>(std::max(0, max_user_series_)));
  User others;
  for (size_t i = own; i < users.size(); ++i) {
    const User& user = *users[i].second;
    for (const auto& [device, slots] : user.slots_in_use) others.slots_in_use[device] += slots;
    others.running_jobs += user.running_jobs;
    others.queued_jobs += user.queued_jobs;
    others.fair_share_slot_seconds += user.fair_share_slot_seconds;
  }
  users.resize(own);
  if (own < snapshot.users.size()) users.emplace_back(kOtherUsersLabel, &others);
  for (const auto& [owner, user] : users) {
    const std::string label = owner == kOtherUsersLabel ? owner : UserLabel(owner);
    for (const auto& [device, slots] : user->slots_in_use) {
      user_slots_->Set({{"user", label}, {"device", DeviceName(device)}},
                       static_cast<double>(slots));
    }
    user_jobs_->Set({{"user", label}, {"state", "running"}},
                    static_cast<double>(user->running_jobs));
    user_jobs_->Set({{"user", label}, {"state", "queued"}}, static_cast<double>(user->queued_jobs));
    user_fair_share_->Set({{"user", label}}, user->fair_share_slot_seconds);
  }
  user_series_->Set({{"state", "all"}}, static_cast<double>(snapshot.users.size()));
  user_series_->Set({{"state", "own"}}, static_cast<double>(own));
}

void CoordinatorMetrics::SetFailedLocked(const ClusterSnapshot& snapshot) {
  const size_t limit = static_cast<size_t>(std::max(0, max_failed_series_));
  for (size_t i = 0; i < snapshot.failed.size() && i < limit; ++i) {
    const v1::Job& job = snapshot.failed[i];
    job_failed_->Set(
        {{"job", job.job_id()}, {"user", UserLabel(job.owner())}, {"reason", job.reason()}},
        static_cast<double>(job.end_time_us()) / 1e6);
  }
}

void CoordinatorMetrics::SetJobLocked(const v1::JobStatus& status) {
  const std::string& job_id = status.job().job_id();
  const std::vector<prometheus::ClientMetric::Label> job = {{"job", job_id}};
  const v1::Metrics& latest = status.job().latest_metrics();
  int64_t step = latest.step();
  for (const v1::RankStatus& rank : status.ranks()) step = std::max(step, rank.step());
  job_step_->Set(job, static_cast<double>(step));
  const double total = Value(latest, "total_steps", 0);
  if (total > 0) {
    job_progress_->Set(job, std::min(1.0, static_cast<double>(step) / total));
    if (latest.step_time_seconds() > 0) {
      job_eta_->Set(job,
                    std::max(0.0, total - static_cast<double>(step)) * latest.step_time_seconds());
    }
  }
  if (latest.samples_per_second() > 0) job_samples_->Set(job, latest.samples_per_second());
  if (latest.step() > 0) job_loss_->Set(job, latest.loss());
  if (latest.values().count("checkpoint_bytes")) {
    checkpoint_bytes_->Set(job, Value(latest, "checkpoint_bytes", 0));
    checkpoint_stall_->Set(job, Value(latest, "checkpoint_stall_seconds", 0));
    checkpoint_store_->Set(job, Value(latest, "checkpoint_store_seconds", 0));
  }
  // Only a job that streams data.shards reports these (DataWindow in
  // worker/train/trainer.cc).
  if (latest.values().count("data_wait_seconds")) {
    data_wait_->Set(job, Value(latest, "data_wait_seconds", 0));
  }
  if (latest.values().count("data_read_bytes_per_second")) {
    data_read_->Set(job, Value(latest, "data_read_bytes_per_second", 0));
  }
  std::map<std::string, int> diagnoses_by_kind;
  for (const v1::Diagnosis& d : status.diagnoses()) {
    ++diagnoses_by_kind[v1::Diagnosis::Kind_Name(d.kind())];
  }
  for (const auto& [kind, count] : diagnoses_by_kind) {
    job_diagnoses_->Set({{"job", job_id}, {"kind", kind}}, count);
  }
}

void CoordinatorMetrics::SetRanksLocked(const v1::JobStatus& status) {
  const std::string& job_id = status.job().job_id();
  const v1::RankSummary& summary = status.rank_summary();
  for (const auto& [state, count] : summary.by_state()) {
    job_ranks_->Set({{"job", job_id}, {"state", state}}, count);
  }
  job_rank_series_->Set({{"job", job_id}}, summary.ranks() <= max_rank_series_ ? 1 : 0);
  if (summary.oldest_heartbeat_rank() >= 0) {
    job_min_step_->Set({{"job", job_id}}, static_cast<double>(summary.min_step()));
    job_heartbeat_age_->Set({{"job", job_id}}, summary.oldest_heartbeat_age_seconds());
  }
  if (summary.most_waited_for_rank() >= 0) {
    job_caused_->Set({{"job", job_id}}, summary.most_waited_for_seconds());
  }
  std::map<int, std::string> culprit_kind;  // a rank's first diagnosis
  for (const v1::Diagnosis& d : status.diagnoses()) {
    for (int rank : d.ranks()) culprit_kind.emplace(rank, v1::Diagnosis::Kind_Name(d.kind()));
  }
  for (const v1::RankStatus& rank : status.ranks()) {
    const std::vector<prometheus::ClientMetric::Label> labels = {
        {"host", rank.host()}, {"job", job_id}, {"rank", absl::StrCat(rank.rank())}};
    if (auto it = culprit_kind.find(rank.rank()); it != culprit_kind.end()) {
      std::vector<prometheus::ClientMetric::Label> with_kind = labels;
      with_kind.push_back({"kind", it->second});
      rank_diagnosed_->Set(with_kind, 1);
    }
    rank_step_->Set(labels, static_cast<double>(rank.step()));
    rank_heartbeat_age_->Set(labels, rank.heartbeat_age_seconds());
    rank_samples_->Set(labels, rank.samples_per_second());
    rank_step_seconds_->Set(labels, rank.step_time_seconds());
    rank_compute_->Set(labels, rank.compute_seconds());
    rank_wait_->Set(labels, rank.comm_wait_seconds());
    rank_caused_->Set(labels, rank.caused_wait_seconds());
    rank_phase_seconds_->Set(labels, rank.phase_seconds());
    rank_loss_->Set(labels, rank.loss());
    std::vector<prometheus::ClientMetric::Label> with_phase = labels;
    with_phase.push_back({"phase", v1::Phase_Name(rank.phase())});
    rank_phase_->Set(with_phase, 1);
  }
}

}  // namespace chorus
