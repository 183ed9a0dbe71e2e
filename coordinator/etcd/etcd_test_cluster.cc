#include "coordinator/etcd/etcd_test_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/etcd/etcd_client.h"

namespace chorus {
namespace {

// `count` distinct free ports: all are bound (port 0) before any is
// released, so no two are the same.
absl::StatusOr<std::vector<int>> FreePorts(int count) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      status = absl::InternalError(absl::StrCat("picking a free port: ", strerror(errno)));
    } else {
      ports.push_back(ntohs(address.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

std::string Url(int port) { return absl::StrCat("http://127.0.0.1:", port); }

}  // namespace

absl::StatusOr<LeaderFence> PermanentTestFence(EtcdClient& etcd, const std::string& prefix) {
  const std::string key = prefix + "/leader";
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  txn.add_success()->mutable_request_put()->set_key(key);
  txn.add_success()->mutable_request_range()->set_key(key);
  txn.add_failure()->mutable_request_range()->set_key(key);
  absl::StatusOr<etcdserverpb::TxnResponse> result = etcd.Txn(txn);
  if (!result.ok()) return result.status();
  const etcdserverpb::RangeResponse& read =
      result->responses(result->responses_size() - 1).response_range();
  if (read.kvs_size() != 1) return absl::InternalError("the test leader key vanished");
  return LeaderFence{key, read.kvs(0).create_revision()};
}

absl::StatusOr<std::unique_ptr<EtcdTestCluster>> EtcdTestCluster::Start(int members,
                                                                        absl::Duration timeout,
                                                                        std::string etcd_binary) {
  if (access(etcd_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(etcd_binary, " is missing: run deploy/setup.sh (it installs etcd-server)"));
  }
  const char* tmp = getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/etcd-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  std::unique_ptr<EtcdTestCluster> cluster(new EtcdTestCluster(pattern, std::move(etcd_binary)));
  absl::StatusOr<std::vector<int>> ports = FreePorts(2 * members);
  if (!ports.ok()) return ports.status();
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    Member member;
    member.name = absl::StrCat("m", i);
    member.data_dir = absl::StrCat(pattern, "/", member.name);
    member.client_port = (*ports)[2 * i];
    member.peer_port = (*ports)[2 * i + 1];
    peers.push_back(absl::StrCat(member.name, "=", Url(member.peer_port)));
    cluster->members_.push_back(std::move(member));
  }
  cluster->initial_cluster_ = absl::StrJoin(peers, ",");
  for (Member& member : cluster->members_) {
    if (absl::Status s = cluster->Spawn(member); !s.ok()) return s;
  }
  if (absl::Status s = cluster->WaitHealthy(timeout); !s.ok()) return s;
  return cluster;
}

absl::Status EtcdTestCluster::Spawn(Member& member) {
  std::vector<std::string> args = {
      binary_,
      "--name=" + member.name,
      "--data-dir=" + member.data_dir,
      "--listen-client-urls=" + Url(member.client_port),
      "--advertise-client-urls=" + Url(member.client_port),
      "--listen-peer-urls=" + Url(member.peer_port),
      "--initial-advertise-peer-urls=" + Url(member.peer_port),
      "--initial-cluster=" + initial_cluster_,
      "--initial-cluster-state=new",
      "--initial-cluster-token=" + root_,
      "--heartbeat-interval=50",
      "--election-timeout=500",
      "--logger=zap",
      "--log-outputs=" + member.data_dir + ".log",
  };
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  member.pid = pid;
  return absl::OkStatus();
}

EtcdTestCluster::~EtcdTestCluster() {
  for (int i = 0; i < size(); ++i) Kill(i);
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

std::string EtcdTestCluster::endpoint(int member) const {
  return absl::StrCat("127.0.0.1:", members_[member].client_port);
}

std::string EtcdTestCluster::endpoints() const {
  std::vector<std::string> all;
  for (int i = 0; i < size(); ++i) all.push_back(endpoint(i));
  return absl::StrJoin(all, ",");
}

void EtcdTestCluster::Kill(int member) {
  Member& m = members_[member];
  if (m.pid <= 0) return;
  kill(m.pid, SIGKILL);
  while (waitpid(m.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  m.pid = -1;
}

absl::Status EtcdTestCluster::Restart(int member) {
  if (members_[member].pid > 0) return absl::OkStatus();
  return Spawn(members_[member]);
}

absl::Status EtcdTestCluster::WaitHealthy(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < size(); ++i) {
    if (members_[i].pid <= 0) continue;
    EtcdOptions options;
    options.endpoints = endpoint(i);
    options.call_timeout = absl::Milliseconds(500);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
    if (!client.ok()) return client.status();
    etcdserverpb::RangeRequest read;
    read.set_key("health");
    absl::Status last;
    do {
      if (waitpid(members_[i].pid, nullptr, WNOHANG) == members_[i].pid) {
        members_[i].pid = -1;
        return absl::InternalError(absl::StrCat("etcd member ", members_[i].name,
                                                " exited; see ", members_[i].data_dir, ".log"));
      }
      last = (*client)->Range(read).status();
    } while (!last.ok() && absl::Now() < deadline);
    if (!last.ok()) {
      return absl::DeadlineExceededError(absl::StrCat("etcd member ", members_[i].name,
                                                      " not healthy: ", last.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace chorus
