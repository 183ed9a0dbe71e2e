// EtcdCoordinatorState: what a coordinator started with --state etcd://
// holds: the etcd client, its leadership (EtcdLeadership), and how to open
// the durable state once it leads.
//
// Thread-safety: as EtcdClient and EtcdLeadership; OpenState from one
// thread at a time.
//
// Example:
//   ASSIGN_OR_RETURN(auto etcd, EtcdCoordinatorState::Connect(options));
//   RETURN_IF_ERROR(etcd->leadership().Campaign());
//   server_options.open_state = [&] { return etcd->OpenState(); };
//   ASSIGN_OR_RETURN(auto server, CoordinatorServer::Start(server_options));
//   etcd->leadership().WaitUntilLost();
#ifndef CHORUS_COORDINATOR_ETCD_ETCD_COORDINATOR_STATE_H_
#define CHORUS_COORDINATOR_ETCD_ETCD_COORDINATOR_STATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_leadership.h"
#include "coordinator/etcd/state_url.h"
#include "coordinator/state/leadership.h"
#include "coordinator/state/state_store.h"

namespace chorus {

struct EtcdCoordinatorStateOptions {
  StateUrl url;       // kind kEtcd
  EtcdOptions etcd;   // endpoints are taken from `url`
  LeaderInfo self;    // what this coordinator publishes when it leads
  absl::Duration lease_ttl = absl::Seconds(2);  // --leader_lease_seconds
  // --checkpoint_dir: checked to be the directory the cluster shares.
  std::string checkpoint_dir;
};

// Checks the options without touching the network or files.
// INVALID_ARGUMENT naming the flag.
absl::Status ValidateEtcdCoordinatorStateOptions(const EtcdCoordinatorStateOptions& options);

class EtcdCoordinatorState {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdCoordinatorState>> Connect(
      EtcdCoordinatorStateOptions options);
  EtcdCoordinatorState(const EtcdCoordinatorState&) = delete;
  EtcdCoordinatorState& operator=(const EtcdCoordinatorState&) = delete;

  EtcdLeadership& leadership() { return *leadership_; }
  EtcdClient& client() { return *client_; }

  // Before the first campaign: CheckSharedDirectory (etcd_state_store.h)
  // for --checkpoint_dir.
  absl::Status CheckCheckpointDirectory();
  // The state, every write fenced on the leadership won last, after checking
  // the checkpoint directory is the shared one.
  // REQUIRES: leadership().Campaign() returned OK.
  absl::StatusOr<std::unique_ptr<StateStore>> OpenState();

 private:
  EtcdCoordinatorState(EtcdCoordinatorStateOptions options, std::unique_ptr<EtcdClient> client);

  const EtcdCoordinatorStateOptions options_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdLeadership> leadership_;  // uses client_
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ETCD_ETCD_COORDINATOR_STATE_H_
