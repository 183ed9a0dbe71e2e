// EtcdTestCluster: 1 or 3 real etcd members on 127.0.0.1, for tests. Each
// member gets free client and peer ports and its own data directory under
// the test's temporary directory; members are killed (SIGKILL) and their
// directories removed when the cluster is destroyed, and die with the test
// process if it crashes (PR_SET_PDEATHSIG). Election settings are short
// (50 ms heartbeat, 500 ms election timeout) so that a cluster forms and
// re-forms within a second.
//
// Thread-safety: none; use from the test's thread.
//
// Example:
//   ASSERT_OK_AND_ASSIGN(auto etcd, EtcdTestCluster::Start(3));
//   EtcdOptions options{.endpoints = etcd->endpoints()};
//   etcd->Kill(0);
//   ASSERT_TRUE(etcd->Restart(0).ok());
#ifndef CHORUS_COORDINATOR_ETCD_ETCD_TEST_CLUSTER_H_
#define CHORUS_COORDINATOR_ETCD_ETCD_TEST_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_leadership.h"

namespace chorus {

// A fence for tests of the state alone: puts PREFIX/leader without a lease
// (so it never expires) unless it exists, and returns its create_revision.
absl::StatusOr<LeaderFence> PermanentTestFence(EtcdClient& etcd, const std::string& prefix);

class EtcdTestCluster {
 public:
  // Starts `members` members and waits (at most `timeout`) until the cluster
  // serves a linearizable read. FAILED_PRECONDITION if `etcd_binary` is
  // missing (deploy/setup.sh installs etcd-server).
  static absl::StatusOr<std::unique_ptr<EtcdTestCluster>> Start(
      int members, absl::Duration timeout = absl::Seconds(15),
      std::string etcd_binary = "/usr/bin/etcd");
  EtcdTestCluster(const EtcdTestCluster&) = delete;
  EtcdTestCluster& operator=(const EtcdTestCluster&) = delete;
  ~EtcdTestCluster();

  // Every member's client address, "127.0.0.1:P1,127.0.0.1:P2,...".
  std::string endpoints() const;
  // One member's client address.
  std::string endpoint(int member) const;
  int size() const { return static_cast<int>(members_.size()); }

  // SIGKILL, and waits for the process to be gone.
  void Kill(int member);
  // Starts a killed member again on its data directory and ports.
  absl::Status Restart(int member);
  // Waits until the cluster serves a linearizable read through every member
  // that runs.
  absl::Status WaitHealthy(absl::Duration timeout);

 private:
  struct Member {
    std::string name;
    std::string data_dir;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  EtcdTestCluster(std::string root, std::string binary) : root_(root), binary_(binary) {}
  absl::Status Spawn(Member& member);

  const std::string root_;
  const std::string binary_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace chorus

#endif  // CHORUS_COORDINATOR_ETCD_ETCD_TEST_CLUSTER_H_
