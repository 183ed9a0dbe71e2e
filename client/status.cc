// chorus status JOB: the job, its ranks, and any problems the coordinator
// has diagnosed.

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/rpc.h"
#include "common/grpc_util.h"

namespace chorus::client {
namespace {

// The Ranks section of a job without rank rows: a pending job says what it
// waits for; an ended one (the coordinator keeps no rows for it) how it
// ended, why, and where its ranks ran.
std::string NoRanksSection(const v1::JobStatus& status) {
  const v1::Job& job = status.job();
  switch (job.state()) {
    case v1::Job::SUCCEEDED:
    case v1::Job::FAILED:
    case v1::Job::CANCELLED:
      break;
    default:
      return status.pending_reason().empty()
                 ? "Ranks: none yet\n"
                 : absl::StrCat("Ranks: none yet - ", status.pending_reason(), "\n");
  }
  std::string out = absl::StrCat("Ranks: none running - the job ended ", StateName(job.state()),
                                 " at ", FormatTime(job.end_time_us()));
  if (job.start_time_us() == 0) {
    absl::StrAppend(&out, " before any rank started");
  } else if (job.end_time_us() >= job.start_time_us()) {
    absl::StrAppend(&out, absl::StrFormat(" after %.1f s with %d rank%s",
                                          (job.end_time_us() - job.start_time_us()) / 1e6,
                                          job.world_size(), job.world_size() == 1 ? "" : "s"));
  }
  absl::StrAppend(&out, "\n");
  if (!job.reason().empty()) absl::StrAppend(&out, "  reason: ", job.reason(), "\n");
  for (int r = 0; r < job.placements_size(); ++r) {
    const v1::RankPlacement& p = job.placements(r);
    absl::StrAppend(&out, "  rank ", r, " ran on ", p.host(), " slot ", p.slot(), "\n");
  }
  return out;
}

// For a job whose rows are a page of its ranks: which, and how to see more.
std::string PagedRanksNote(const v1::JobStatus& status) {
  const v1::RankSummary& summary = status.rank_summary();
  if (summary.ranks() <= status.ranks_size()) return "";
  std::string by_state;
  for (const auto& [state, count] : summary.by_state()) {
    absl::StrAppend(&by_state, by_state.empty() ? "" : ", ", count, " ", state);
  }
  std::string note = absl::StrFormat(
      "  (%d of %d ranks shown from rank %d, with any a problem names; --rank_offset N for "
      "others)\n  all ranks: %s; steps %d..%d",
      status.ranks_size(), summary.ranks(), status.rank_offset(), by_state, summary.min_step(),
      summary.max_step());
  if (summary.oldest_heartbeat_rank() >= 0) {
    absl::StrAppend(&note, absl::StrFormat("; oldest heartbeat %.1fs (rank %d)",
                                           summary.oldest_heartbeat_age_seconds(),
                                           summary.oldest_heartbeat_rank()));
  }
  return note + "\n";
}

}  // namespace

void AddStatusCommand(CLI::App& app, const GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("status", "Show a job: state, ranks and problems.");
  auto job_id = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("job", *job_id, "Job id, e.g. job-000001.")->required();
  cmd->add_flag("--json", *json, "Print the JobStatus as JSON (proto field names).");
  auto rank_offset = std::make_shared<int>(0);
  auto rank_limit = std::make_shared<int>(0);
  cmd->add_option("--rank_offset", *rank_offset,
                  "Rank rows from this rank on (a large job's rows come in pages).")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rank_limit", *rank_limit,
                  "At most this many rank rows (0: the coordinator's default, 1024).")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([job_id, json, rank_offset, rank_limit, &global, &exit_code] {
    v1::GetJobStatusRequest request;
    request.set_job_id(*job_id);
    request.set_rank_offset(*rank_offset);
    request.set_rank_limit(*rank_limit);
    v1::JobStatus status;
    grpc::ClientContext context;
    SetDeadline(context, global);
    absl::Status s = FromGrpcStatus(JobStub(global)->GetJobStatus(&context, request, &status));
    if (!s.ok()) {
      exit_code = ReportError("status", s, global);
      return;
    }
    if (*json) {
      *global.out << ToJson(status);
      exit_code = kExitOk;
      return;
    }
    const v1::Job& job = status.job();
    *global.out << job.job_id() << " (" << job.spec().name() << "): " << StateName(job.state());
    if (!job.reason().empty()) *global.out << " - " << job.reason();
    *global.out << "\n  ";
    if (!job.owner().empty()) *global.out << "owner " << job.owner() << ", ";
    *global.out << "submitted " << FormatTime(job.submit_time_us()) << ", started "
                << FormatTime(job.start_time_us()) << ", ended " << FormatTime(job.end_time_us())
                << "\n  generation " << job.generation() << ", world size " << job.world_size();
    if (job.spec().has_elastic()) {
      *global.out << ", restarts " << job.restarts() << " of elastic.max_restarts "
                  << job.spec().elastic().max_restarts();
    }
    *global.out << "\n";
    if (!status.page_url().empty()) *global.out << "  page " << status.page_url() << "\n";
    if (status.ranks().empty()) {
      *global.out << NoRanksSection(status);
    } else {
      *global.out << absl::StrFormat("Ranks:\n  %-5s %-16s %-8s %-9s %-8s %-11s %-9s %s\n", "RANK",
                                     "HOST", "PID", "STATE", "STEP", "PHASE", "HEARTBEAT",
                                     "LAST_SEQ");
      for (const v1::RankStatus& r : status.ranks()) {
        *global.out << absl::StrFormat(
            "  %-5d %-16s %-8d %-9s %-8d %-11s %-9s %d\n", r.rank(), r.host(), r.pid(),
            v1::RankStatus::State_Name(r.state()), r.step(), v1::Phase_Name(r.phase()),
            absl::StrFormat("%.1fs", r.heartbeat_age_seconds()), r.last_completed_seq());
      }
      *global.out << PagedRanksNote(status);
    }
    if (status.diagnoses().empty()) {
      *global.out << "Problems: none\n";
    } else {
      *global.out << "Problems:\n";
      for (const v1::Diagnosis& d : status.diagnoses()) {
        *global.out << "  " << v1::Diagnosis::Kind_Name(d.kind()) << " " << d.message() << "\n";
      }
    }
    exit_code = kExitOk;
  });
}

}  // namespace chorus::client
