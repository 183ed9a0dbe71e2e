// JobWrites: each job's durable writes (its state, events, placements,
// elastic record) in the order they were decided, run after the deciding
// lock is released (Note [The scheduler's writes after its lock] in
// call_outbox.h).
//
// A write is added to a Batch under the caller's lock, which fixes its place
// in its job's order (a ticket). The batch runs later, outside that lock: each
// write waits until every earlier write of its job has run. Writes of
// different jobs never wait for each other, so one job's slow write holds up
// only later writes of the same job.
//
// A batch runs its writes in the order they were added. Tickets are taken in
// time order and a write only ever waits for writes whose tickets are older,
// each of which waits only for older ones still, so batches cannot wait for
// each other in a circle.
//
// Thread-safety: all methods may be called concurrently; a Batch belongs to
// one thread.
//
// Example:
//   JobWrites::Batch writes(order);          // one per call, before the lock
//   {
//     absl::MutexLock lock(&mu_);
//     writes.Add(job_id, [&jobs, job_id] { (void)jobs.Finish(...); });
//   }
//   writes.Run();                             // durable when it returns
#ifndef CHORUS_COORDINATOR_STATE_JOB_WRITES_H_
#define CHORUS_COORDINATOR_STATE_JOB_WRITES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace chorus {

class JobWrites {
 public:
  // A durable write that handles its own errors (logs them, or records what
  // a caller needs in state it captured).
  using Write = std::function<void()>;

  // The writes one call decided, to run once its lock is released.
  class Batch {
   public:
    explicit Batch(JobWrites& order) : order_(order) {}
    // Runs whatever was added and not run yet: every ticket taken must run,
    // or the job's later writes would wait for ever.
    ~Batch() { Run(); }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

    // Takes `job_id`'s next place in order for `write`. Cheap: call it under
    // the lock that decided the write.
    void Add(const std::string& job_id, Write write);
    // Runs the writes added so far, each in its job's turn; when it returns,
    // they and every write of their jobs decided before them have run. Call
    // it without the deciding lock held.
    void Run();
    bool empty() const { return entries_.empty(); }

   private:
    struct Entry {
      std::string job_id;
      int64_t ticket;
      Write write;
    };
    JobWrites& order_;
    std::vector<Entry> entries_;
  };

  JobWrites() = default;
  JobWrites(const JobWrites&) = delete;
  JobWrites& operator=(const JobWrites&) = delete;

  // How many jobs have writes waiting or running.
  int jobs_in_flight() const;

 private:
  struct Lane {
    int64_t issued = 0;  // the last ticket taken
    int64_t done = 0;    // the last ticket run
  };
  int64_t Take(const std::string& job_id);
  void RunInTurn(const std::string& job_id, int64_t ticket, const Write& write);

  mutable absl::Mutex mu_;
  // Only jobs with a ticket not yet run have a lane.
  std::map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_STATE_JOB_WRITES_H_
