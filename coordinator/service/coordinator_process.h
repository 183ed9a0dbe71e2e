// CoordinatorProcess: what chorus-coordinator runs between startup and
// SIGTERM. A LeaderLoop over `leadership` whose leader is the full
// CoordinatorServer and whose follower (only when several coordinators
// share one state) is the FollowerServer, both on the options' ports, and
// the leadership metrics (chorus_leader, chorus_leader_changes_total)
// appended to either one's /metrics.
//
// With SoleLeadership and no follower (the default, one coordinator with
// SQLite under --state_dir) it starts the full server at once, exactly as
// before leadership existed.
//
// Thread-safety: Run on one thread, Stop from any.
//
// Example:
//   SoleLeadership sole(LeaderInfo{...});
//   CoordinatorProcess process(options, sole, /*follow=*/false, write_port_files);
//   std::thread signals([&] { sigwait(...); process.Stop(); });
//   RETURN_IF_ERROR(process.Run());
#ifndef CHORUS_COORDINATOR_SERVICE_COORDINATOR_PROCESS_H_
#define CHORUS_COORDINATOR_SERVICE_COORDINATOR_PROCESS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/service/leader_loop.h"
#include "coordinator/service/server.h"
#include "coordinator/state/leadership.h"

namespace chorus {

// chorus_leader and chorus_leader_changes_total in Prometheus text format.
std::string LeaderMetricsText(bool leading, int64_t leader_changes);

// Where clients reach a coordinator started with `options` once it bound
// `ports`: its gRPC HOST:PORT and the http://HOST:PORT of its status page
// (empty without an HTTP port). The gRPC address is `advertise`
// (--advertise_address; its port 0 stands for the bound one) when set, else
// --listen's host with the bound port. The status page's host is
// --http_listen's, or the advertised host when that is a wildcard.
struct AdvertisedAddress {
  std::string grpc;
  std::string http_url;
};
AdvertisedAddress AdvertisedAddressOf(const ServerOptions& options, const std::string& advertise,
                                      const LeaderLoop::Ports& ports);

// Whether a coordinator that publishes its address (--state etcd://) has one
// that clients can dial: --advertise_address when set, else --listen.
// INVALID_ARGUMENT naming the flag when that address does not parse or its
// host is a wildcard (0.0.0.0, ::), which would send every client to itself.
absl::Status ValidateAdvertisedAddress(const std::string& listen, const std::string& advertise);

class CoordinatorProcess {
 public:
  // `follow`: serve a FollowerServer while another coordinator leads.
  // `on_listening` gets the ports once the first server listens.
  CoordinatorProcess(ServerOptions options, Leadership& leadership, bool follow,
                     std::function<void(const LeaderLoop::Ports&)> on_listening);

  absl::Status Run() { return loop_.Run(); }
  void Stop() { loop_.Stop(); }
  const LeaderLoop& loop() const { return loop_; }

 private:
  // The options with the ports a first server bound (LeaderLoop::Ports).
  ServerOptions OnPorts(const LeaderLoop::Ports& ports) const;
  absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> StartLeader(const LeaderLoop::Ports& ports);
  absl::StatusOr<std::unique_ptr<LeaderLoop::Serving>> StartFollower(
      const LeaderLoop::Ports& ports);
  LeaderLoop::Options LoopOptions(bool follow,
                                  std::function<void(const LeaderLoop::Ports&)> on_listening);
  std::string MetricsText() const;

  const ServerOptions options_;
  Leadership& leadership_;
  LeaderLoop loop_;  // last: its starters use the members above
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_SERVICE_COORDINATOR_PROCESS_H_
