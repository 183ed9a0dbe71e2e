// The coordinator's HTTP routes (served by HttpServer on --http_listen):
//   /metrics          every CoordinatorMetrics figure, Prometheus text format
//   /                 the job list, the queue and the users (HTML); /api/jobs
//                     its JSON
//   /jobs/ID          a job's page (HTML); /api/jobs/ID its JSON; 404 for an
//                     unknown job
//   /assets/...       the page's script and style and the charting library,
//                     embedded in the binary
// (docs/observability.md). With a token file, /login is answered by the
// HttpServer itself (Note [Browser login] in http_server.cc).
//
// Thread-safety: the handlers may run concurrently; they read the job
// manager, the scheduler and the checkpoint store under their own locks.
//
// Example:
//   ASSIGN_OR_RETURN(auto http, HttpServer::Start(options, StatusRoutes(sources)));
#ifndef CHORUS_COORDINATOR_HTTP_STATUS_ROUTES_H_
#define CHORUS_COORDINATOR_HTTP_STATUS_ROUTES_H_

#include <functional>
#include <string>
#include <vector>

#include "coordinator/checkpoint/checkpoint_store.h"
#include "coordinator/http/coordinator_metrics.h"
#include "coordinator/http/http_server.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/state/job_manager.h"

namespace chorus {

// What the routes read; every pointer must outlive the HTTP server.
struct StatusSources {
  JobManager* jobs = nullptr;
  const Scheduler* scheduler = nullptr;
  CoordinatorMetrics* metrics = nullptr;
  CheckpointStore* checkpoints = nullptr;  // may be null: no checkpoint history
  // Appended to /metrics when set (Prometheus text).
  std::function<std::string()> extra_metrics;
};

// The coordinator's state now, as /metrics sees it.
ClusterSnapshot TakeSnapshot(const StatusSources& sources);

std::vector<HttpRoute> StatusRoutes(const StatusSources& sources);

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_HTTP_STATUS_ROUTES_H_
