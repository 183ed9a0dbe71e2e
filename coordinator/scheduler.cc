#include "coordinator/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "coordinator/hang_detector.h"
#include "glog/logging.h"

namespace chorus {

void Scheduler::Outbox::Flush() {
  for (auto& [send, message] : messages) send(message);
  for (auto& [done, result] : joins) done(std::move(result));
  messages.clear();
  joins.clear();
}

Scheduler::Scheduler(JobManager& jobs, Clock* clock, std::string coordinator_address)
    : jobs_(jobs), clock_(clock ? clock : &real_clock_),
      coordinator_address_(std::move(coordinator_address)) {}

std::vector<std::string> Scheduler::AgentsInOrder() const {
  std::vector<std::string> ids;
  for (const auto& [id, agent] : agents_) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [this](const std::string& a, const std::string& b) {
    return agents_.at(a).order < agents_.at(b).order;
  });
  return ids;
}

absl::StatusOr<std::string> Scheduler::AddAgent(const v1::AgentHello& hello, Sender send) {
  if (hello.slots() < 1 || hello.slots() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent hello: slots must be in [1, 1024], got ", hello.slots()));
  }
  Outbox out;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = absl::StrCat("agent-", next_agent_++);
    Agent agent;
    agent.hello = hello;
    if (agent.hello.device() == v1::ResourceSpec::DEVICE_UNSPECIFIED) {
      agent.hello.set_device(v1::ResourceSpec::CPU);
    }
    agent.send = std::move(send);
    agent.busy.assign(hello.slots(), false);
    agent.order = next_agent_;
    v1::CoordinatorMessage welcome;
    welcome.mutable_welcome()->set_agent_id(id);
    out.messages.emplace_back(agent.send, welcome);
    agents_[id] = std::move(agent);
    LOG(INFO) << "agent " << id << " on " << hello.host() << " offers " << hello.slots() << " "
              << v1::ResourceSpec::Device_Name(agents_[id].hello.device()) << " slot(s)";
    // Ranks it still runs: rebind them to the jobs taken back after a
    // restart; stop those whose job is no longer running.
    std::map<std::string, std::vector<int>> orphans;
    for (const v1::RunningRank& r : hello.running()) {
      auto run = running_.find(r.job_id());
      Placement* match = nullptr;
      if (run != running_.end() && run->second.generation == r.generation()) {
        for (Placement& p : run->second.ranks) {
          if (p.agent_id.empty() && p.recover_host == hello.host() && p.recover_agent_pid == hello.pid() &&
              p.slot == r.slot()) {
            match = &p;
          }
        }
      }
      if (match == nullptr || r.slot() < 0 || r.slot() >= hello.slots()) {
        orphans[r.job_id()].push_back(r.slot());
        continue;
      }
      match->agent_id = id;
      match->pid = r.pid();
      match->state = v1::RankStatus::TRAINING;
      agents_[id].busy[r.slot()] = true;
      LOG(INFO) << r.job_id() << ": slot " << r.slot() << " on " << hello.host() << " is back";
    }
    for (auto& [job_id, slots] : orphans) {
      v1::CoordinatorMessage m;
      m.mutable_stop()->set_job_id(job_id);
      for (int slot : slots) m.mutable_stop()->add_slots(slot);
      m.mutable_stop()->set_grace_seconds(10);
      m.mutable_stop()->set_reason("the coordinator no longer runs this job");
      out.messages.emplace_back(agents_[id].send, std::move(m));
    }
    ScheduleLocked(out);
  }
  out.Flush();
  return id;
}

void Scheduler::RemoveAgent(const std::string& agent_id) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(agent_id);
    if (it == agents_.end()) return;
    const std::string host = it->second.hello.host();
    agents_.erase(it);
    std::vector<std::string> affected;
    for (const auto& [job_id, run] : running_) {
      for (const Placement& p : run.ranks) {
        if (p.agent_id == agent_id && p.state != v1::RankStatus::EXITED) {
          affected.push_back(job_id);
          break;
        }
      }
    }
    for (const std::string& job_id : affected) {
      EndLocked(job_id, v1::Job::FAILED,
                absl::StrCat("lost contact with the agent on ", host, " (", agent_id,
                             "), which ran ranks of this job"),
                out);
    }
    ScheduleLocked(out);
  }
  out.Flush();
}

Scheduler::Running Scheduler::NewRunning(const v1::Job& job, int world, int64_t generation) {
  Running run;
  run.hang_detection = job.spec().hang_detection();
  run.generation = generation;
  run.upload_template.set_world_size(world);
  run.upload_template.set_strategy(job.spec().strategy().has_decentralized() ? "decentralized" : "ddp");
  run.upload_template.set_spec_hash(Sha256Hex(job.spec().SerializeAsString()));
  run.upload_template.set_generation(generation);
  run.upload_template.set_per_rank(job.spec().checkpoint().per_rank() && job.spec().strategy().has_decentralized());
  run.keep_last = job.spec().checkpoint().has_keep_last() ? job.spec().checkpoint().keep_last() : 3;
  if (job.spec().checkpoint().storage() == v1::CheckpointSpec::SHARED_DIR) {
    run.shared_dir = job.spec().checkpoint().shared_dir();
  }
  return run;
}

void Scheduler::ScheduleLocked(Outbox& out) {
  // Oldest first: List returns newest first.
  std::vector<v1::Job> pending = jobs_.List({v1::Job::PENDING}, 0);
  std::reverse(pending.begin(), pending.end());
  for (const v1::Job& job : pending) {
    const v1::ResourceSpec& r = job.spec().resources();
    std::vector<std::pair<std::string, int>> free;  // (agent, slot) in rank order
    for (const std::string& id : AgentsInOrder()) {
      const Agent& agent = agents_.at(id);
      if (agent.hello.device() != r.device()) continue;
      for (int s = 0; s < static_cast<int>(agent.busy.size()); ++s) {
        if (!agent.busy[s]) free.emplace_back(id, s);
      }
    }
    if (static_cast<int>(free.size()) < r.min_ranks()) return;  // strict FIFO
    free.resize(std::min<size_t>(free.size(), r.max_ranks()));
    const int world = static_cast<int>(free.size());
    v1::CheckpointManifest resume;
    if (!job.resume_from().empty()) {
      std::vector<std::string> skipped;
      absl::StatusOr<v1::CheckpointManifest> found =
          resolve_resume_ ? resolve_resume_(job.resume_from(), &skipped)
                          : absl::UnimplementedError("this coordinator keeps no checkpoints");
      for (const std::string& warning : skipped) {
        v1::JobEvent event;
        event.set_message(absl::StrCat("warning: ", warning, "; using an older one"));
        (void)jobs_.AddEvent(job.job_id(), std::move(event));
      }
      if (!found.ok()) {
        (void)jobs_.Finish(job.job_id(), v1::Job::FAILED,
                           absl::StrCat("cannot resume from ", job.resume_from(), ": ", found.status().message()));
        continue;
      }
      resume = *std::move(found);
    }
    absl::StatusOr<v1::Job> started = jobs_.MarkRunning(job.job_id(), 1, world);
    if (!started.ok()) {
      LOG(ERROR) << "cannot start " << job.job_id() << ": " << started.status();
      return;
    }
    Running run = NewRunning(job, world, /*generation=*/1);
    run.resume = std::move(resume);
    std::map<std::string, v1::CoordinatorMessage> launches;
    std::map<std::string, int> per_agent;
    for (const auto& [agent_id, slot] : free) ++per_agent[agent_id];
    for (const auto& [agent_id, slot] : free) {
      agents_.at(agent_id).busy[slot] = true;
      Placement p;
      p.agent_id = agent_id;
      p.slot = slot;
      v1::CoordinatorMessage& m = launches[agent_id];
      v1::LaunchRanks* launch = m.mutable_launch();
      launch->set_job_id(job.job_id());
      launch->set_generation(1);
      launch->set_coordinator(coordinator_address_);
      p.local_rank = launch->ranks_size();
      p.local_world_size = per_agent[agent_id];
      v1::RankLaunch* rank = launch->add_ranks();
      rank->set_slot(slot);
      rank->set_local_rank(p.local_rank);
      rank->set_local_world_size(p.local_world_size);
      run.ranks.push_back(std::move(p));
    }
    std::vector<v1::RankPlacement> placements;
    for (const Placement& p : run.ranks) {
      v1::RankPlacement& rp = placements.emplace_back();
      rp.set_host(agents_.at(p.agent_id).hello.host());
      rp.set_agent_pid(agents_.at(p.agent_id).hello.pid());
      rp.set_slot(p.slot);
      rp.set_local_rank(p.local_rank);
      rp.set_local_world_size(p.local_world_size);
    }
    if (absl::Status s = jobs_.SavePlacements(job.job_id(), placements); !s.ok()) {
      LOG(ERROR) << job.job_id() << ": could not record placements (a restart would lose the job): " << s;
    }
    for (auto& [agent_id, message] : launches) {
      out.messages.emplace_back(agents_.at(agent_id).send, std::move(message));
    }
    LOG(INFO) << "started " << job.job_id() << " with " << world << " rank(s)";
    running_[job.job_id()] = std::move(run);
  }
}

void Scheduler::Schedule() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    ScheduleLocked(out);
  }
  out.Flush();
}

void Scheduler::EndLocked(const std::string& job_id, v1::Job::State state,
                          const std::string& reason, Outbox& out) {
  auto it = running_.find(job_id);
  if (it == running_.end()) return;
  std::map<std::string, std::vector<int>> to_stop;
  for (Placement& p : it->second.ranks) {
    auto agent = agents_.find(p.agent_id);
    if (agent != agents_.end()) {
      agent->second.busy[p.slot] = false;
      if (p.state != v1::RankStatus::EXITED) to_stop[p.agent_id].push_back(p.slot);
    }
    if (p.pending) {
      out.joins.emplace_back(std::move(p.pending),
                             absl::AbortedError(absl::StrCat("job ", job_id, " ended: ", reason)));
      p.pending = nullptr;
    }
  }
  for (auto& [agent_id, slots] : to_stop) {
    v1::CoordinatorMessage m;
    m.mutable_stop()->set_job_id(job_id);
    for (int s : slots) m.mutable_stop()->add_slots(s);
    m.mutable_stop()->set_grace_seconds(10);
    m.mutable_stop()->set_reason(reason);
    out.messages.emplace_back(agents_.at(agent_id).send, std::move(m));
  }
  running_.erase(it);
  if (state != v1::Job::CANCELLED) {
    absl::StatusOr<v1::Job> ended = jobs_.Finish(job_id, state, reason);
    if (!ended.ok()) LOG(ERROR) << "recording the end of " << job_id << ": " << ended.status();
  }
}

void Scheduler::RankExited(const std::string& agent_id, const v1::RankExited& exited) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(exited.job_id());
    if (it == running_.end()) return;  // already ended (e.g. stopped after a failure)
    Running& run = it->second;
    const v1::AgentHello& agent = agents_.at(agent_id).hello;
    for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
      Placement& p = run.ranks[rank];
      // A rank that exited while the coordinator was restarting is reported
      // after its agent reconnects, before it was bound again.
      const bool unbound_here = p.agent_id.empty() && p.recover_host == agent.host() &&
                                p.recover_agent_pid == agent.pid();
      if ((p.agent_id != agent_id && !unbound_here) || p.slot != exited.slot() ||
          p.state == v1::RankStatus::EXITED) {
        continue;
      }
      if (unbound_here) p.agent_id = agent_id;
      p.state = v1::RankStatus::EXITED;
      p.exit_code = exited.exit_code();
      if (exited.exit_code() != 0) {
        const std::string how = exited.exit_code() < 0
                                    ? absl::StrCat("was killed by signal ", -exited.exit_code())
                                    : absl::StrCat("exited with code ", exited.exit_code());
        std::string reason = absl::StrCat("rank ", rank, " (", agents_.at(agent_id).hello.host(),
                                          ", pid ", exited.pid(), ") ", how);
        if (!exited.stderr_tail().empty()) {
          absl::StrAppend(&reason, "; last stderr: ", exited.stderr_tail(exited.stderr_tail_size() - 1));
        }
        EndLocked(exited.job_id(), v1::Job::FAILED, reason, out);
      } else if (++run.exited_ok == static_cast<int>(run.ranks.size())) {
        EndLocked(exited.job_id(), v1::Job::SUCCEEDED, "every rank exited with code 0", out);
      }
      break;
    }
    ScheduleLocked(out);
  }
  out.Flush();
}

void Scheduler::Join(const v1::JoinRequest& request, absl::Time deadline, JoinDone done) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(request.job_id());
    if (it == running_.end()) {
      absl::StatusOr<v1::Job> job = jobs_.Get(request.job_id());
      absl::Status status = job.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                           "job ", request.job_id(), " is ",
                                           v1::Job::State_Name(job->state()), ", not running"))
                                     : job.status();
      out.joins.emplace_back(std::move(done), status);
    } else if (request.generation() != it->second.generation) {
      out.joins.emplace_back(std::move(done), absl::FailedPreconditionError(absl::StrCat(
                                                  "generation ", request.generation(),
                                                  " of job ", request.job_id(),
                                                  " is stale; the current generation is ",
                                                  it->second.generation)));
    } else {
      Running& run = it->second;
      auto placement = std::find_if(run.ranks.begin(), run.ranks.end(), [&](const Placement& p) {
        return p.agent_id == request.agent_id() && p.slot == request.slot();
      });
      if (placement == run.ranks.end()) {
        out.joins.emplace_back(std::move(done), absl::NotFoundError(absl::StrCat(
                                                    "job ", request.job_id(), " has no rank on ",
                                                    request.agent_id(), " slot ", request.slot())));
      } else {
        if (placement->pending) {  // a retry replaces the earlier call
          out.joins.emplace_back(std::move(placement->pending),
                                 absl::AbortedError("superseded by a newer Join of the same rank"));
        }
        placement->joined = true;
        placement->pid = request.pid();
        placement->state = v1::RankStatus::JOINING;
        placement->pending = std::move(done);
        placement->join_deadline = deadline;
        const bool complete = std::all_of(run.ranks.begin(), run.ranks.end(),
                                          [](const Placement& p) { return p.joined; });
        if (complete) {
          absl::StatusOr<v1::Job> job = jobs_.Get(request.job_id());
          for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
            Placement& p = run.ranks[rank];
            v1::JoinResponse response;
            response.set_rank(static_cast<int>(rank));
            response.set_world_size(static_cast<int>(run.ranks.size()));
            response.set_generation(run.generation);
            if (job.ok()) *response.mutable_spec() = job->spec();
            response.set_store_namespace(absl::StrCat(request.job_id(), "/gen-", run.generation));
            response.set_local_rank(p.local_rank);
            response.set_local_world_size(p.local_world_size);
            if (!run.resume.job_id().empty()) *response.mutable_resume() = run.resume;
            p.state = v1::RankStatus::TRAINING;
            if (p.pending) out.joins.emplace_back(std::move(p.pending), response);
            p.pending = nullptr;
          }
        }
      }
    }
  }
  out.Flush();
}

std::vector<v1::Diagnosis> Scheduler::DiagnoseLocked(const Running& run) const {
  std::vector<RankView> views;
  for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
    const Placement& p = run.ranks[rank];
    RankView v;
    v.rank = static_cast<int>(rank);
    v.exited = p.state == v1::RankStatus::EXITED;
    v.has_heartbeat = p.heartbeat_at != absl::InfinitePast();
    v.heartbeat_at = p.heartbeat_at;
    v.heartbeat = p.last_heartbeat;
    if (v.has_heartbeat || v.exited) views.push_back(std::move(v));
  }
  return DiagnoseHangs(run.hang_detection, views, clock_->Now());
}

namespace {

// Identifies "the same problem" across ticks: kind, culprits and collective.
std::string DiagnosisKey(const v1::Diagnosis& d) {
  return absl::StrCat(v1::Diagnosis::Kind_Name(d.kind()), " rank", d.ranks_size() > 1 ? "s " : " ",
                      absl::StrJoin(d.ranks(), ","), d.seq() > 0 ? absl::StrCat(" at #", d.seq()) : "");
}

}  // namespace

std::map<std::string, std::vector<v1::Diagnosis>> Scheduler::TrackDiagnosesLocked() {
  std::map<std::string, std::vector<v1::Diagnosis>> current;
  const int64_t now_us = absl::ToUnixMicros(clock_->Now());
  for (auto& [job_id, run] : running_) {
    std::vector<v1::Diagnosis> diagnoses = DiagnoseLocked(run);
    std::map<std::string, int64_t> seen;
    for (v1::Diagnosis& d : diagnoses) {
      const std::string key = DiagnosisKey(d);
      auto before = run.diagnoses_seen_us.find(key);
      const bool is_new = before == run.diagnoses_seen_us.end();
      d.set_first_seen_us(is_new ? now_us : before->second);
      seen[key] = d.first_seen_us();
      if (is_new) {
        v1::JobEvent event;
        *event.mutable_diagnosis() = d;
        if (absl::Status s = jobs_.AddEvent(job_id, std::move(event)); !s.ok()) {
          LOG(ERROR) << job_id << ": could not record a diagnosis event: " << s;
        }
      }
    }
    // Problems that went away become events too ("as they appear and clear").
    for (const auto& [key, since_us] : run.diagnoses_seen_us) {
      if (seen.count(key)) continue;
      v1::JobEvent event;
      event.set_message(absl::StrCat("cleared: ", key, " (seen for ",
                                     absl::StrFormat("%.1f", (now_us - since_us) / 1e6), " s)"));
      if (absl::Status s = jobs_.AddEvent(job_id, std::move(event)); !s.ok()) {
        LOG(ERROR) << job_id << ": could not record a cleared diagnosis: " << s;
      }
    }
    run.diagnoses_seen_us = std::move(seen);
    current[job_id] = std::move(diagnoses);
  }
  return current;
}

void Scheduler::Tick() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    ExpireJoinsLocked(out);
    std::vector<std::pair<std::string, std::string>> to_fail;
    const absl::Time now = clock_->Now();
    for (auto& [job_id, run] : running_) {
      if (run.recovering_until == absl::InfinitePast()) continue;
      const int missing = static_cast<int>(std::count_if(run.ranks.begin(), run.ranks.end(),
                                                         [](const Placement& p) { return p.agent_id.empty(); }));
      if (missing == 0) {
        run.recovering_until = absl::InfinitePast();
        v1::JobEvent event;
        event.set_message("every rank is back after the coordinator restart");
        (void)jobs_.AddEvent(job_id, std::move(event));
      } else if (now > run.recovering_until) {
        to_fail.emplace_back(job_id, absl::StrCat(missing, " of ", run.ranks.size(),
                                                  " rank(s) did not come back after the coordinator restarted"));
      }
    }
    for (const auto& [job_id, diagnoses] : TrackDiagnosesLocked()) {
      const v1::HangDetectionSpec::Action action = running_.at(job_id).hang_detection.action();
      if (action != v1::HangDetectionSpec::ABORT && action != v1::HangDetectionSpec::RESTART) continue;
      for (const v1::Diagnosis& d : diagnoses) {
        if (d.kind() == v1::Diagnosis::STRAGGLER) continue;  // a warning only
        std::string reason = absl::StrCat("hang detection: ", v1::Diagnosis::Kind_Name(d.kind()), " ",
                                          d.message());
        if (action == v1::HangDetectionSpec::RESTART) {
          absl::StrAppend(&reason, " (action RESTART acts as ABORT until elastic generations exist)");
        }
        to_fail.emplace_back(job_id, std::move(reason));
        break;
      }
    }
    for (const auto& [job_id, reason] : to_fail) EndLocked(job_id, v1::Job::FAILED, reason, out);
    if (!to_fail.empty()) ScheduleLocked(out);
  }
  out.Flush();
}

void Scheduler::ExpireJoinsLocked(Outbox& out) {
  {
    const absl::Time now = clock_->Now();
    for (auto& [job_id, run] : running_) {
      std::vector<int> missing;
      for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
        if (!run.ranks[rank].joined) missing.push_back(static_cast<int>(rank));
      }
      for (Placement& p : run.ranks) {
        if (p.pending && p.join_deadline <= now) {
          out.joins.emplace_back(
              std::move(p.pending),
              absl::DeadlineExceededError(absl::StrCat(
                  "generation ", run.generation, " of job ", job_id,
                  " did not complete in time; ranks that have not joined: ",
                  absl::StrJoin(missing, ","))));
          p.pending = nullptr;
          p.joined = false;
        }
      }
    }
  }
}

absl::Status Scheduler::Report(const v1::ReportRequest& report) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(report.job_id());
  if (it == running_.end()) {
    return jobs_.Get(report.job_id()).ok()
               ? absl::FailedPreconditionError(absl::StrCat("job ", report.job_id(), " is not running"))
               : absl::NotFoundError(absl::StrCat("no job \"", report.job_id(), "\""));
  }
  if (report.generation() != it->second.generation || report.rank() < 0 ||
      report.rank() >= static_cast<int>(it->second.ranks.size())) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", report.rank(), " of generation ",
                                                      report.generation(), " is not part of job ",
                                                      report.job_id(), " now"));
  }
  if (report.rank() != 0) return absl::OkStatus();
  RETURN_IF_ERROR(jobs_.UpdateMetrics(report.job_id(), report.metrics(), report.final()));
  v1::JobEvent event;
  *event.mutable_metrics() = report.metrics();
  return jobs_.AddEvent(report.job_id(), std::move(event));
}

bool Scheduler::Heartbeat(const v1::RankHeartbeat& heartbeat) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(heartbeat.job_id());
  if (it == running_.end() || heartbeat.generation() != it->second.generation ||
      heartbeat.rank() < 0 || heartbeat.rank() >= static_cast<int>(it->second.ranks.size())) {
    return false;
  }
  Placement& p = it->second.ranks[heartbeat.rank()];
  p.last_heartbeat = heartbeat;
  p.heartbeat_at = clock_->Now();
  return true;
}

absl::StatusOr<int64_t> Scheduler::RequestCheckpoint(const std::string& job_id) {
  ASSIGN_OR_RETURN(v1::Job job, jobs_.Get(job_id));
  Outbox out;
  int64_t step = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(job_id);
    if (it == running_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ", v1::Job::State_Name(job.state()),
                                                        "; only a running job can be checkpointed"));
    }
    std::map<std::string, v1::CoordinatorMessage> by_agent;
    for (const Placement& p : it->second.ranks) {
      step = std::max(step, p.last_heartbeat.step());
      if (p.agent_id.empty() || p.state == v1::RankStatus::EXITED || !agents_.count(p.agent_id)) continue;
      v1::CoordinatorMessage& m = by_agent[p.agent_id];
      m.mutable_checkpoint()->set_job_id(job_id);
      m.mutable_checkpoint()->add_slots(p.slot);
    }
    for (auto& [agent_id, m] : by_agent) out.messages.emplace_back(agents_.at(agent_id).send, std::move(m));
  }
  out.Flush();
  return step;
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& job_id, const std::string& reason) {
  Outbox out;
  absl::StatusOr<v1::Job> job;
  {
    absl::MutexLock lock(&mu_);
    job = jobs_.Cancel(job_id, reason);
    if (job.ok()) EndLocked(job_id, v1::Job::CANCELLED, job->reason(), out);
    ScheduleLocked(out);
  }
  out.Flush();
  return job;
}

void Scheduler::FillStatus(const std::string& job_id, v1::JobStatus& status) const {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(job_id);
  if (it == running_.end()) return;
  for (size_t rank = 0; rank < it->second.ranks.size(); ++rank) {
    const Placement& p = it->second.ranks[rank];
    v1::RankStatus* row = status.add_ranks();
    row->set_rank(static_cast<int>(rank));
    auto agent = agents_.find(p.agent_id);
    row->set_host(agent != agents_.end() ? agent->second.hello.host() : p.agent_id);
    row->set_pid(p.pid);
    row->set_state(p.state);
    row->set_exit_code(p.exit_code);
    if (p.heartbeat_at != absl::InfinitePast()) {
      const v1::RankHeartbeat& hb = p.last_heartbeat;
      row->set_step(hb.step());
      row->set_phase(hb.phase());
      row->set_phase_seconds(hb.phase_seconds());
      row->set_heartbeat_age_seconds(absl::ToDoubleSeconds(clock_->Now() - p.heartbeat_at));
      row->set_last_completed_seq(hb.flight_recorder().last_completed_seq());
      row->set_step_time_seconds(hb.timings().step_seconds());
    }
  }
  const int64_t now_us = absl::ToUnixMicros(clock_->Now());
  for (v1::Diagnosis& d : DiagnoseLocked(it->second)) {
    auto seen = it->second.diagnoses_seen_us.find(DiagnosisKey(d));
    d.set_first_seen_us(seen != it->second.diagnoses_seen_us.end() ? seen->second : now_us);
    *status.add_diagnoses() = std::move(d);
  }
}

void Scheduler::Recover(const std::vector<v1::Job>& running, absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = clock_->Now() + grace;
  for (const v1::Job& job : running) {
    if (job.placements().empty()) {
      (void)jobs_.Finish(job.job_id(), v1::Job::FAILED,
                         "the coordinator restarted and has no record of where this job's ranks ran");
      continue;
    }
    Running run = NewRunning(job, job.placements_size(), job.generation());
    run.recovering_until = until;
    for (const v1::RankPlacement& rp : job.placements()) {
      Placement p;
      p.slot = rp.slot();
      p.local_rank = rp.local_rank();
      p.local_world_size = rp.local_world_size();
      p.state = v1::RankStatus::LOST;
      p.joined = true;
      p.recover_host = rp.host();
      p.recover_agent_pid = rp.agent_pid();
      run.ranks.push_back(std::move(p));
    }
    LOG(INFO) << job.job_id() << ": taken back after a restart; waiting up to " << absl::FormatDuration(grace)
              << " for its " << run.ranks.size() << " rank(s) to come back";
    v1::JobEvent event;
    event.set_message(absl::StrCat("the coordinator restarted; waiting up to ", absl::FormatDuration(grace),
                                   " for the job's ranks to come back with their agents"));
    (void)jobs_.AddEvent(job.job_id(), std::move(event));
    running_[job.job_id()] = std::move(run);
  }
}

void Scheduler::set_resume_resolver(ResumeResolver resolver) {
  absl::MutexLock lock(&mu_);
  resolve_resume_ = std::move(resolver);
}

absl::StatusOr<Scheduler::UploadGrant> Scheduler::GrantUpload(const std::string& job_id, int64_t generation,
                                                              int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(job_id);
  if (it == running_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint upload for ", job_id, ", which is not running"));
  }
  if (generation != it->second.generation) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint upload from generation ", generation, " of ",
                                                      job_id, ", whose current generation is ",
                                                      it->second.generation));
  }
  const v1::CheckpointManifest& manifest = it->second.upload_template;
  if (manifest.per_rank() ? (rank < 0 || rank >= manifest.world_size()) : rank != 0) {
    return absl::FailedPreconditionError(
        manifest.per_rank()
            ? absl::StrCat("checkpoint upload from rank ", rank, " of ", job_id, ", which has ranks 0..",
                           manifest.world_size() - 1)
            : absl::StrCat("checkpoint upload from rank ", rank, "; only rank 0 uploads (replicas are identical)"));
  }
  return UploadGrant{it->second.upload_template, it->second.keep_last, it->second.shared_dir};
}

void Scheduler::Logs(const std::string& agent_id, const v1::RankLogs& logs) {
  int rank = -1;
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(logs.job_id());
    if (it != running_.end()) {
      for (size_t r = 0; r < it->second.ranks.size(); ++r) {
        const Placement& p = it->second.ranks[r];
        if (p.agent_id == agent_id && p.slot == logs.slot()) rank = static_cast<int>(r);
      }
    }
  }
  logs_.Append(logs.job_id(), rank, logs.slot(), agent_id, absl::ToUnixMicros(clock_->Now()),
               {logs.lines().begin(), logs.lines().end()});
}

absl::StatusOr<v1::GetLogsResponse> Scheduler::GetLogs(const v1::GetLogsRequest& request) const {
  ASSIGN_OR_RETURN(v1::Job job, jobs_.Get(request.job_id()));
  v1::GetLogsResponse response = logs_.Get(request);
  absl::MutexLock lock(&mu_);
  response.set_complete(JobManager::IsTerminal(job.state()) && !running_.count(request.job_id()));
  return response;
}

void Scheduler::set_coordinator_address(std::string address) {
  absl::MutexLock lock(&mu_);
  coordinator_address_ = std::move(address);
}

int Scheduler::free_slots() const {
  absl::MutexLock lock(&mu_);
  int free = 0;
  for (const auto& [id, agent] : agents_) {
    free += static_cast<int>(std::count(agent.busy.begin(), agent.busy.end(), false));
  }
  return free;
}

}  // namespace chorus
