// P2pLanes: where a host backend's point-to-point ops wait for their peers
// after the op queue has posted them (Note [Point-to-point progress]).
//
// One lane per peer and direction (sends to rank 2, receives from rank 2,
// ...), each with a thread made the first time it is used. A lane waits for
// its ops in the order they were added, which is the order the peer matches
// them in, and finishes each through `finish` as soon as its wait returns.
//
// Thread-safety: Add may be called from any thread.
//
// Example (the Gloo backend's Send, inside an op body on the queue's thread):
//   buffer->Send(dst, slot, 0, bytes);
//   work.Defer(nullptr);
//   lanes_.Add(P2pLanes::SendLane(dst), work.shared_from_this(),
//              [buffer] { buffer->WaitSend(timeout); return absl::OkStatus(); });
#ifndef CHORUS_WORKER_COMM_P2P_LANES_H_
#define CHORUS_WORKER_COMM_P2P_LANES_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/op_queue.h"

namespace chorus {

class P2pLanes {
 public:
  // Finishes an op with the status its wait returned (OpQueue::Complete,
  // after naming the op in an error).
  using Finish = std::function<void(QueuedWork&, absl::Status)>;
  // Blocks until the op's transfer is done; its error, if it failed.
  using WaitFn = std::function<absl::Status()>;

  explicit P2pLanes(Finish finish);
  P2pLanes(const P2pLanes&) = delete;
  P2pLanes& operator=(const P2pLanes&) = delete;
  // Runs the waits already added and joins the threads. REQUIRES: every
  // such wait returns (the backend has aborted its transport, or its peers
  // answer).
  ~P2pLanes();

  static int SendLane(int peer) { return 2 * peer; }
  static int RecvLane(int peer) { return 2 * peer + 1; }

  // Waits with `wait` on lane `lane` once the waits added to it before have
  // returned, then finishes `work` with its status.
  void Add(int lane, std::shared_ptr<QueuedWork> work, WaitFn wait);

 private:
  struct Lane {
    std::deque<std::pair<std::shared_ptr<QueuedWork>, WaitFn>> pending;
    std::thread thread;
  };
  void Run(Lane* lane);

  const Finish finish_;
  absl::Mutex mu_;
  std::map<int, std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// Note [Point-to-point progress]
// The op queue runs one op at a time, in issue order. A send that held it
// until its peer received (as it did) hangs the commonest exchange there
// is: every rank sends to its right, then receives from its left, then
// waits for both (torch's isend/irecv, a pipeline's 1F1B schedule, a halo
// exchange). Each rank's queue holds its send; the receive that would match
// its neighbour's send is queued behind it; no rank moves. Gloo's own
// process group does not hang there, and neither may Chorus.
// So a send or a receive holds the queue only while it is posted to the
// transport, which returns at once; matching stays per pair in issue order
// because posting does (the k-th send a->b takes slot k of the pair). The
// op then waits on a lane of its peer and direction while the queue goes on
// to later ops, collectives included, and finishes when its lane's wait
// returns. Waits on one lane finish in order, as the peer matches them in
// order; lanes do not wait for each other, since a rank may rightly wait
// for a receive before its peer takes an earlier send (the peer receives
// only after a collective that the first rank joins once its receive is
// in). In the flight recorder the op is started until it finishes, so a
// send whose peer never posts the receive is seen, as before, inside it.
// A transport error or the op timeout fails the op, which breaks the queue
// like any failed op; Abort wakes the lanes' waits with the queue's op.

}  // namespace chorus

#endif  // CHORUS_WORKER_COMM_P2P_LANES_H_
