#include "coordinator/scheduling/job_resume.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

v1::CheckpointManifest Manifest(const std::string& job_id, int64_t step) {
  v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  return manifest;
}

// A checkpoint store with job-000001's checkpoints at steps 100 and 200, the
// newer one unusable: resolving skips it.
JobResume::Resolver Store() {
  return [](const std::string& from, std::vector<std::string>* skipped)
             -> absl::StatusOr<v1::CheckpointManifest> {
    if (from != "job-000001" && from != "job-000001:100") {
      return absl::NotFoundError("no checkpoint of " + from);
    }
    if (from == "job-000001") skipped->push_back("step 200: a shard's checksum does not match");
    return Manifest("job-000001", 100);
  };
}

RunningJob RunOf(int64_t generation, bool program) {
  v1::Job job;
  job.set_job_id("job-000002");
  job.mutable_spec()->mutable_elastic();
  if (program) job.mutable_spec()->mutable_program()->add_argv("/usr/bin/python3");
  RunningJob run(job, 2, generation);
  run.ResumeFrom(Manifest("job-000001", 100));  // what it was submitted with
  return run;
}

TEST(JobResumeTest, AStartResumesFromItsResumeFrom) {
  const JobResume resume(Store(), nullptr);
  v1::Job job;
  std::vector<std::string> skipped;
  EXPECT_EQ(resume.ForStart(job, &skipped)->job_id(), "");  // none asked for
  job.set_resume_from("job-000001");
  absl::StatusOr<v1::CheckpointManifest> from = resume.ForStart(job, &skipped);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(from->step(), 100);
  EXPECT_EQ(skipped, std::vector<std::string>{"step 200: a shard's checksum does not match"});
  job.set_resume_from("job-000009");
  EXPECT_EQ(resume.ForStart(job, &skipped).status().code(), absl::StatusCode::kNotFound);

  const JobResume none(nullptr, nullptr);
  EXPECT_EQ(none.ForStart(job, &skipped).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(none.NewestStep("job-000001"), 0);
  EXPECT_EQ(resume.NewestStep("job-000001"), 100);
  EXPECT_EQ(resume.NewestStep("job-000009"), 0);
}

// Note [A generation's checkpoint]: a later generation of the built-in
// trainer is told the job's newest committed checkpoint; the first
// generation and a program's are told what the job was submitted with.
TEST(JobResumeTest, ALaterGenerationOfTheTrainerIsToldTheNewestCommitted) {
  const JobResume::Resolver newest = [](const std::string& job_id, std::vector<std::string>*)
      -> absl::StatusOr<v1::CheckpointManifest> {
    if (job_id == "job-000002") return Manifest("job-000002", 340);
    return absl::NotFoundError("none");
  };
  const JobResume resume(Store(), newest);
  struct Row {
    const char* name;
    RunningJob run;
    std::string job_id;
    int64_t step;
  };
  const Row rows[] = {
      {"generation 1", RunOf(1, false), "job-000002", 100},
      {"generation 3 of the trainer", RunOf(3, false), "job-000002", 340},
      {"generation 3 of a program", RunOf(3, true), "job-000002", 100},
      {"nothing committed yet", RunOf(3, false), "job-000003", 100},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(resume.ForGeneration(row.job_id, row.run).step(), row.step);
  }
}

}  // namespace
}  // namespace chorus
