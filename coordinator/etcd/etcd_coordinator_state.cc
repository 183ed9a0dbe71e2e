#include "coordinator/etcd/etcd_coordinator_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/etcd/etcd_state_store.h"

namespace chorus {

absl::Status ValidateEtcdCoordinatorStateOptions(const EtcdCoordinatorStateOptions& options) {
  if (options.url.kind != StateUrl::Kind::kEtcd) {
    return absl::InvalidArgumentError("--state: not an etcd:// state");
  }
  EtcdOptions etcd = options.etcd;
  etcd.endpoints = options.url.endpoints;
  RETURN_IF_ERROR(ValidateEtcdOptions(etcd));
  if (options.lease_ttl < absl::Seconds(1) || options.lease_ttl > absl::Minutes(5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--leader_lease_seconds ", absl::ToDoubleSeconds(options.lease_ttl),
                     ": must be in [1, 300] (a new leader takes over within about this long)"));
  }
  if (options.checkpoint_dir.empty() || options.checkpoint_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--state etcd://... needs --checkpoint_dir, an absolute path on storage "
                     "every coordinator shares (got \"",
                     options.checkpoint_dir, "\")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EtcdCoordinatorState>> EtcdCoordinatorState::Connect(
    EtcdCoordinatorStateOptions options) {
  RETURN_IF_ERROR(ValidateEtcdCoordinatorStateOptions(options));
  options.etcd.endpoints = options.url.endpoints;
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Connect(options.etcd));
  return std::unique_ptr<EtcdCoordinatorState>(
      new EtcdCoordinatorState(std::move(options), std::move(client)));
}

EtcdCoordinatorState::EtcdCoordinatorState(EtcdCoordinatorStateOptions options,
                                           std::unique_ptr<EtcdClient> client)
    : options_(std::move(options)), client_(std::move(client)) {
  EtcdLeadershipOptions leadership;
  leadership.prefix = options_.url.prefix;
  leadership.self = options_.self;
  leadership.lease_ttl = options_.lease_ttl;
  leadership_ = std::make_unique<EtcdLeadership>(*client_, std::move(leadership));
}

absl::Status EtcdCoordinatorState::CheckCheckpointDirectory() {
  return CheckSharedDirectory(*client_, options_.url.prefix, options_.checkpoint_dir,
                              absl::StrCat(client_->name(), " under ", options_.url.prefix));
}

absl::StatusOr<std::unique_ptr<StateStore>> EtcdCoordinatorState::OpenState() {
  EtcdStateStoreOptions store;
  store.still_leading = [leadership = leadership_.get()] { return leadership->IsLeader(); };
  // A refused write ends the term at once: the leader loop then stops
  // serving instead of answering as leader until the next renewal.
  store.on_fenced = [leadership = leadership_.get(), fence = leadership_->fence()](
                        const std::string& why) { leadership->Deposed(fence, why); };
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdStateStore> state,
                   EtcdStateStore::Open(*client_, options_.url.prefix, leadership_->fence(),
                                        std::move(store)));
  RETURN_IF_ERROR(state->ClaimSharedDirectory(options_.checkpoint_dir));
  return std::unique_ptr<StateStore>(std::move(state));
}

}  // namespace chorus
