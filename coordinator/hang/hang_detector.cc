#include "coordinator/hang/hang_detector.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace chorus {
namespace {

// "allreduce/sum ddp:model/bucket2 (float32[1048576], 4.0 MB)": what a
// MISMATCH needs to show which of op, tag, dtype and size differ.
std::string Describe(const v1::CollectiveFingerprint& fp) {
  std::string s = absl::StrCat(fp.op(), " ", fp.tag());
  std::vector<std::string> shape;
  if (!fp.dtype().empty()) shape.push_back(absl::StrCat(fp.dtype(), "[", fp.count(), "]"));
  if (fp.bytes() > 0) {
    shape.push_back(fp.bytes() >= (1 << 20) ? absl::StrFormat("%.1f MB", fp.bytes() / 1048576.0)
                                            : absl::StrFormat("%d bytes", fp.bytes()));
  }
  if (!shape.empty()) absl::StrAppend(&s, " (", absl::StrJoin(shape, ", "), ")");
  return s;
}

// A send or a receive (or a SendRecv, which is both): paired per peer, not
// by position among the collectives (Note [Pairing ranks' ops]).
bool PointToPoint(const v1::CollectiveRecord& r) {
  return r.send_index() > 0 || r.recv_index() > 0;
}

// A collective's position among its rank's collectives; a rank that
// predates collective_index numbers only by seq.
int64_t CollectiveKey(const v1::CollectiveRecord& r) {
  return r.collective_index() > 0 ? r.collective_index() : r.seq();
}

// How many collectives the rank has issued, counted as `like` is keyed.
int64_t Issued(const v1::RankHeartbeat& hb, const v1::CollectiveRecord& like) {
  return like.collective_index() > 0 ? hb.flight_recorder().collectives_enqueued()
                                     : hb.flight_recorder().last_enqueued_seq();
}

bool SameFingerprint(const v1::CollectiveFingerprint& a, const v1::CollectiveFingerprint& b) {
  return a.op() == b.op() && a.tag() == b.tag() && a.dtype() == b.dtype() && a.count() == b.count();
}

bool DeclaredPause(const v1::RankHeartbeat& hb, const v1::HangDetectionSpec& spec) {
  const bool pause =
      hb.phase() == v1::SETUP || hb.phase() == v1::EVAL || hb.phase() == v1::CHECKPOINT;
  return pause && hb.phase_seconds() < spec.phase_limit_seconds();
}

bool Unfinished(const v1::CollectiveRecord& r) {
  return r.state() == v1::CollectiveRecord::STARTED || r.state() == v1::CollectiveRecord::RUNNING;
}

// The oldest collective this rank has started and not finished. Its sends
// and receives are not collectives: they may wait while later ops run.
const v1::CollectiveRecord* Waiting(const v1::RankHeartbeat& hb) {
  const v1::CollectiveRecord* oldest = nullptr;
  for (const v1::CollectiveRecord& r : hb.flight_recorder().records()) {
    if (Unfinished(r) && !PointToPoint(r) && (oldest == nullptr || r.seq() < oldest->seq())) {
      oldest = &r;
    }
  }
  return oldest;
}

// Median completed duration of collectives tagged `tag` across ranks.
std::optional<absl::Duration> TypicalDuration(const std::vector<RankView>& ranks,
                                              const std::string& tag) {
  std::vector<int64_t> us;
  for (const RankView& v : ranks) {
    for (const v1::CollectiveRecord& r : v.hb().flight_recorder().records()) {
      // A record that ends before it starts (a clock stepped back, a
      // damaged heartbeat) says nothing about durations; with both times
      // positive and ordered the difference cannot overflow.
      // A device op's time inside the collective starts when the GPU
      // reached it, not when it was queued behind the rank's earlier work.
      const int64_t began = r.running_us() > 0 ? r.running_us() : r.started_us();
      if (r.state() == v1::CollectiveRecord::COMPLETED && r.fingerprint().tag() == tag &&
          began > 0 && r.completed_us() >= began) {
        us.push_back(r.completed_us() - began);
      }
    }
  }
  if (us.empty()) return std::nullopt;
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return absl::Microseconds(us[us.size() / 2]);
}

v1::Diagnosis Make(v1::Diagnosis::Kind kind, std::vector<int> ranks, std::vector<int> waiting,
                   int64_t seq, double seconds, std::string message) {
  v1::Diagnosis d;
  d.set_kind(kind);
  for (int r : ranks) d.add_ranks(r);
  for (int r : waiting) d.add_waiting_ranks(r);
  d.set_seq(seq);
  d.set_duration_seconds(seconds);
  d.set_message(std::move(message));
  return d;
}

const RankView& ViewOf(const std::vector<RankView>& ranks, int rank) {
  return *std::find_if(ranks.begin(), ranks.end(),
                       [rank](const RankView& v) { return v.rank == rank; });
}

std::string Plural(size_t n, const char* one, const char* many) { return n > 1 ? many : one; }

// Up to when the coordinator would have heard from the rank: now, or, while
// the agent that relays its heartbeats is silent, what the agent's last
// message vouches for (Note [A silent agent's ranks]).
absl::Time HeardUntil(const RankView& v, absl::Time now) {
  if (v.relay_heard_at == absl::InfiniteFuture()) return now;
  return std::clamp(v.relay_heard_at + kAgentMessageInterval, now - kAgentSilenceForgiven, now);
}

// DEAD: ranks whose heartbeats stopped while their process runs on.
void DiagnoseDead(const v1::HangDetectionSpec& spec, const std::vector<RankView>& ranks,
                  absl::Time now, std::vector<v1::Diagnosis>& out) {
  const absl::Duration dead_after = absl::Seconds(spec.dead_after_seconds());
  for (const RankView& v : ranks) {
    if (v.exited || !v.has_heartbeat) continue;
    const absl::Duration age = HeardUntil(v, now) - v.heartbeat_at;
    if (age <= dead_after) continue;
    const absl::Duration agent_silent = now - v.relay_heard_at;
    const std::string agent_too =
        agent_silent > kAgentMessageInterval
            ? absl::StrFormat(
                  " (its agent has been silent for %.1f s too: its node or its link "
                  "may be down)",
                  absl::ToDoubleSeconds(agent_silent))
            : "";
    out.push_back(
        Make(v1::Diagnosis::DEAD, {v.rank}, {}, 0, absl::ToDoubleSeconds(now - v.heartbeat_at),
             absl::StrFormat("rank %d has sent no heartbeat for %.1f s (last seen %s at step %d); "
                             "its process has not exited (its agent would have reported "
                             "that at once), so it is stopped or not responding%s",
                             v.rank, absl::ToDoubleSeconds(now - v.heartbeat_at),
                             v.hb().phase() == v1::PHASE_UNSPECIFIED
                                 ? "with no phase marked"
                                 : absl::StrCat("in ", v1::Phase_Name(v.hb().phase())),
                             v.hb().step(), agent_too)));
  }
}

// What rank `r` said it is doing, for a diagnosis: its phase and step, or,
// for a program that marks no phases (a script on the Python package's
// backend alone), only its step.
std::string Doing(int r, const v1::RankHeartbeat& hb) {
  if (hb.phase() == v1::PHASE_UNSPECIFIED) {
    return absl::StrFormat("rank %d is outside any collective (no phase marked) at step %d", r,
                           hb.step());
  }
  return absl::StrFormat("rank %d is in %s at step %d for %.1f s", r, v1::Phase_Name(hb.phase()),
                         hb.step(), hb.phase_seconds());
}

// MISMATCH: the lowest collective at which two ranks disagree.
void DiagnoseMismatch(const std::vector<RankView>& ranks, std::vector<v1::Diagnosis>& out) {
  std::map<int64_t, std::vector<std::pair<int, const v1::CollectiveRecord*>>> by_seq;
  for (const RankView& v : ranks) {
    for (const v1::CollectiveRecord& r : v.hb().flight_recorder().records()) {
      if (!PointToPoint(r)) by_seq[CollectiveKey(r)].emplace_back(v.rank, &r);
    }
  }
  for (const auto& [seq, seen] : by_seq) {
    const auto& [first_rank, first] = seen[0];
    for (size_t i = 1; i < seen.size(); ++i) {
      const auto& [rank, record] = seen[i];
      if (SameFingerprint(first->fingerprint(), record->fingerprint())) continue;
      v1::Diagnosis d =
          Make(v1::Diagnosis::MISMATCH, {first_rank, rank}, {}, seq, 0,
               absl::StrFormat(
                   "ranks %d and %d issued different collectives at #%d: rank %d %s, rank %d %s "
                   "(are two models or DDP instances called in a different order?)",
                   first_rank, rank, seq, first_rank, Describe(first->fingerprint()), rank,
                   Describe(record->fingerprint())));
      *d.mutable_fingerprint() = first->fingerprint();
      *d.mutable_other_fingerprint() = record->fingerprint();
      out.push_back(std::move(d));
      return;
    }
  }
}

// Where each live rank stands with respect to the lowest collective someone
// is blocked in.
struct Blocked {
  const v1::CollectiveRecord* collective = nullptr;  // null: nobody is blocked
  // Its index among the collectives (its seq, from ranks that number only
  // by seq).
  int64_t seq = 0;
  std::vector<int> inside;             // inside it (waiting for the others)
  std::vector<int> absent;             // have not issued it
  std::vector<int> blocked_elsewhere;  // finished their side, inside the next one
  // Ranks whose GPU has the op queued but has not reached it (Note [Device
  // op states] in worker/comm/flight_recorder.h), with since when.
  std::vector<std::pair<int, absl::Time>> queued;
  size_t live = 0;
  absl::Duration waited;  // by the rank inside it longest
  // The longest wait inside it that a rank's own heartbeat vouches for
  // (Note [A wait the heartbeats vouch for]).
  absl::Duration vouched;
  absl::Duration threshold;  // "far longer than usual"
};

// Note [A wait the heartbeats vouch for]
// A heartbeat says "inside collective #s since t" as of the moment it was
// composed. Read against the coordinator's clock alone, the same heartbeat
// seems to stay inside ever longer once the rank falls silent, and the
// ranks of a job that finished fall silent right after their last
// collective: their heartbeat streams end before their final reports and
// exits. A job whose ranks all stopped heartbeating inside the final
// evaluation's all-reduce was read as STUCK_IN_COLLECTIVE and restarted
// while it shut down. So a rank blocked in a collective counts as blocked
// for as long as its own heartbeats show it there (from the collective's
// start to the heartbeat's composition, both on the rank's clock), and
// STUCK_IN_COLLECTIVE and NEVER_JOINED need a wait that some rank still
// heartbeating vouches for. A rank that stopped heartbeating is DEAD after
// dead_after_seconds; ranks that stopped because they finished are not
// watched at all (RunningJob::HangViews).
absl::Duration Vouched(const RankView& v, const v1::CollectiveRecord& w) {
  const int64_t began = w.running_us() > 0 ? w.running_us() : w.started_us();
  const absl::Time composed =
      v.hb().time_us() > 0 ? absl::FromUnixMicros(v.hb().time_us()) : v.heartbeat_at;
  return composed - absl::FromUnixMicros(began);
}

Blocked FindBlocked(const v1::HangDetectionSpec& spec, const std::vector<RankView>& ranks,
                    absl::Time now) {
  Blocked b;
  for (const RankView& v : ranks) {
    if (v.exited) continue;
    const v1::CollectiveRecord* w = Waiting(v.hb());
    if (w != nullptr &&
        (b.collective == nullptr || CollectiveKey(*w) < CollectiveKey(*b.collective))) {
      b.collective = w;
    }
  }
  if (b.collective == nullptr) return b;
  b.seq = CollectiveKey(*b.collective);
  absl::Time longest_start = absl::InfiniteFuture();
  for (const RankView& v : ranks) {
    if (v.exited) continue;
    ++b.live;
    const v1::CollectiveRecord* w = Waiting(v.hb());
    const bool on_device = !v.hb().flight_recorder().device().empty();
    const int64_t key = w != nullptr ? CollectiveKey(*w) : 0;
    if (w != nullptr && key == b.seq && on_device && w->state() == v1::CollectiveRecord::STARTED) {
      b.queued.emplace_back(v.rank, absl::FromUnixMicros(w->started_us()));
    } else if (w != nullptr && key == b.seq) {
      b.inside.push_back(v.rank);
      b.vouched = std::max(b.vouched, Vouched(v, *w));
      longest_start =
          std::min(longest_start,
                   absl::FromUnixMicros(w->running_us() > 0 ? w->running_us() : w->started_us()));
    } else if (w != nullptr && key == b.seq + 1) {
      b.blocked_elsewhere.push_back(v.rank);
    } else if (Issued(v.hb(), *b.collective) < b.seq) {
      b.absent.push_back(v.rank);
    }
  }
  b.waited = now - longest_start;
  b.threshold = absl::Seconds(spec.stall_after_seconds());
  if (std::optional<absl::Duration> typical =
          TypicalDuration(ranks, b.collective->fingerprint().tag())) {
    b.threshold = std::max(b.threshold, *typical * 10);
  }
  return b;
}

v1::Diagnosis NeverJoined(const Blocked& b, const std::vector<int>& culprits, std::string message) {
  v1::Diagnosis d = Make(v1::Diagnosis::NEVER_JOINED, culprits, b.inside, b.seq,
                         absl::ToDoubleSeconds(b.waited), std::move(message));
  *d.mutable_fingerprint() = b.collective->fingerprint();
  return d;
}

// NEVER_JOINED: ranks that have not issued the collective the others wait in.
void DiagnoseAbsent(const v1::HangDetectionSpec& spec, const std::vector<RankView>& ranks,
                    const Blocked& b, absl::Time now, std::vector<v1::Diagnosis>& out) {
  std::vector<int> culprits;
  std::vector<std::string> doing;
  for (int r : b.absent) {
    const RankView& v = ViewOf(ranks, r);
    if (DeclaredPause(v.hb(), spec)) continue;
    // A rank that has also stopped sending heartbeats is not doing
    // anything we can name: it becomes DEAD once dead_after passes.
    if (now - v.heartbeat_at > kRankSilentAfter) continue;
    // Its last heartbeat predates the wait: what it said then is not
    // what it is doing now (it may have stopped right after sending
    // it). The next heartbeat, within a second, tells.
    if (now - v.heartbeat_at >= b.waited) continue;
    culprits.push_back(r);
    doing.push_back(Doing(r, v.hb()));
  }
  if (culprits.empty()) return;
  out.push_back(NeverJoined(
      b, culprits,
      absl::StrFormat("rank%s %s %s not entered collective #%d %s; rank%s %s %s waited %.1f s; %s",
                      Plural(culprits.size(), "", "s"), absl::StrJoin(culprits, ","),
                      Plural(culprits.size(), "has", "have"), b.seq,
                      Describe(b.collective->fingerprint()), Plural(b.inside.size(), "", "s"),
                      absl::StrJoin(b.inside, ","), Plural(b.inside.size(), "has", "have"),
                      absl::ToDoubleSeconds(b.waited), absl::StrJoin(doing, "; "))));
}

// NEVER_JOINED on a GPU: the peers are inside the collective; these ranks
// issued it, but their GPU is still busy with what they queued before it.
void DiagnoseQueued(const std::vector<RankView>& ranks, const Blocked& b, absl::Time now,
                    std::vector<v1::Diagnosis>& out) {
  std::vector<int> culprits;
  std::vector<std::string> doing;
  for (const auto& [r, since] : b.queued) {
    const RankView& v = ViewOf(ranks, r);
    if (now - v.heartbeat_at > kRankSilentAfter) continue;
    culprits.push_back(r);
    doing.push_back(absl::StrFormat("rank %d queued it %.1f s ago, at step %d", r,
                                    absl::ToDoubleSeconds(now - since), v.hb().step()));
  }
  if (culprits.empty()) return;
  out.push_back(NeverJoined(
      b, culprits,
      absl::StrFormat(
          "the GPU of rank%s %s has not reached collective #%d %s: %s still busy with "
          "kernels queued before it (a long or hung kernel); rank%s %s %s waited %.1f s "
          "inside it; %s",
          Plural(culprits.size(), "", "s"), absl::StrJoin(culprits, ","), b.seq,
          Describe(b.collective->fingerprint()), Plural(culprits.size(), "it is", "they are"),
          Plural(b.inside.size(), "", "s"), absl::StrJoin(b.inside, ","),
          Plural(b.inside.size(), "has", "have"), absl::ToDoubleSeconds(b.waited),
          absl::StrJoin(doing, "; "))));
}

// STUCK_IN_COLLECTIVE: every rank is blocked in a collective. Usually the
// same one; a rank that finished its side of a ring before the network
// failed waits in the next one (blocked_elsewhere).
v1::Diagnosis StuckInCollective(const Blocked& b) {
  const std::string what = Describe(b.collective->fingerprint());
  std::string where = absl::StrFormat("every rank has been inside collective #%d %s", b.seq, what);
  if (!b.blocked_elsewhere.empty()) {
    where = absl::StrFormat(
        "rank%s %s %s been inside collective #%d %s and rank%s %s, which finished "
        "its side of it, in the next one",
        Plural(b.inside.size(), "", "s"), absl::StrJoin(b.inside, ","),
        Plural(b.inside.size(), "has", "have"), b.seq, what,
        Plural(b.blocked_elsewhere.size(), "", "s"), absl::StrJoin(b.blocked_elsewhere, ","));
  }
  std::vector<int> all = b.inside;
  all.insert(all.end(), b.blocked_elsewhere.begin(), b.blocked_elsewhere.end());
  std::sort(all.begin(), all.end());
  v1::Diagnosis d = Make(
      v1::Diagnosis::STUCK_IN_COLLECTIVE, all, {}, b.seq, absl::ToDoubleSeconds(b.waited),
      absl::StrFormat("%s for %.1f s (threshold %.1f s); all of them issued it, so the transport "
                      "or a peer's network is suspect",
                      where, absl::ToDoubleSeconds(b.waited), absl::ToDoubleSeconds(b.threshold)));
  *d.mutable_fingerprint() = b.collective->fingerprint();
  return d;
}

// NODE_SLOW: the ranks StuckInCollective would name all run on starved
// nodes, and the wait is within kStarvedPatience thresholds (Note [A starved
// node] in hang_detector.h); nullopt otherwise.
std::optional<v1::Diagnosis> NodeSlow(const std::vector<RankView>& ranks, const Blocked& b) {
  if (b.waited > b.threshold * kStarvedPatience) return std::nullopt;
  std::vector<int> all = b.inside;
  all.insert(all.end(), b.blocked_elsewhere.begin(), b.blocked_elsewhere.end());
  std::sort(all.begin(), all.end());
  double least = 1;
  for (int r : all) least = std::min(least, ViewOf(ranks, r).node_cpu_pressure);
  if (all.empty() || least < kStarvedPressure) return std::nullopt;
  v1::Diagnosis d =
      Make(v1::Diagnosis::NODE_SLOW, all, {}, b.seq, absl::ToDoubleSeconds(b.waited),
           absl::StrFormat(
               "every rank has been inside collective #%d %s for %.1f s (threshold %.1f s) while "
               "their nodes are starved of CPU (runnable tasks waited for a CPU at least %.0f%% of "
               "the last 10 s): a slow machine, not a hang; no action before %.1f s",
               b.seq, Describe(b.collective->fingerprint()), absl::ToDoubleSeconds(b.waited),
               absl::ToDoubleSeconds(b.threshold), least * 100,
               absl::ToDoubleSeconds(b.threshold * kStarvedPatience)));
  *d.mutable_fingerprint() = b.collective->fingerprint();
  return d;
}

// The diagnoses of ranks blocked in a collective for longer than usual.
void DiagnoseBlocked(const v1::HangDetectionSpec& spec, const std::vector<RankView>& ranks,
                     absl::Time now, std::vector<v1::Diagnosis>& out) {
  const Blocked b = FindBlocked(spec, ranks, now);
  if (b.collective == nullptr || b.waited <= b.threshold || b.vouched <= b.threshold) return;
  if (!b.absent.empty()) {
    DiagnoseAbsent(spec, ranks, b, now, out);
  } else if (!b.queued.empty()) {
    DiagnoseQueued(ranks, b, now, out);
  } else if (b.blocked_elsewhere.size() + b.inside.size() == b.live) {
    std::optional<v1::Diagnosis> slow = NodeSlow(ranks, b);
    out.push_back(slow.has_value() ? *std::move(slow) : StuckInCollective(b));
  }
}

// The view of rank `rank`, if the job has one.
const RankView* FindView(const std::vector<RankView>& ranks, int rank) {
  auto it = std::find_if(ranks.begin(), ranks.end(),
                         [rank](const RankView& v) { return v.rank == rank; });
  return it == ranks.end() ? nullptr : &*it;
}

// Whether `peer`'s records show it has posted its side of message `index`
// between it and `rank`: the receive (`receive`) or the send. Posting the
// k-th implies the ones before it; an unfinished op is always in the
// records, so one that is absent was either never posted or has finished
// (and then `rank`'s side would have finished too).
bool Posted(const RankView& peer, int rank, bool receive, int64_t index) {
  for (const v1::CollectiveRecord& r : peer.hb().flight_recorder().records()) {
    if (receive ? (r.recv_index() >= index && r.recv_from() == rank)
                : (r.send_index() >= index && r.send_to() == rank)) {
      return true;
    }
  }
  return false;
}

// One side of a send or receive that `v` waits in: the peer and whether
// that peer must post a receive (for v's send) or a send (for v's receive).
struct Side {
  int peer;
  bool peer_receives;
  int64_t index;
};

std::vector<Side> SidesOf(const v1::CollectiveRecord& r) {
  std::vector<Side> sides;
  if (r.send_index() > 0) sides.push_back({r.send_to(), true, r.send_index()});
  if (r.recv_index() > 0) sides.push_back({r.recv_from(), false, r.recv_index()});
  return sides;
}

// NEVER_JOINED for a send or receive: rank v has waited in its side of a
// message far longer than usual, and the peer has not posted the other side
// (Note [Pairing ranks' ops]). Each peer is named once.
void DiagnoseUnmatched(const v1::HangDetectionSpec& spec, const std::vector<RankView>& ranks,
                       absl::Time now, std::vector<v1::Diagnosis>& out) {
  std::set<int> named;
  for (const RankView& v : ranks) {
    if (v.exited) continue;
    for (const v1::CollectiveRecord& r : v.hb().flight_recorder().records()) {
      if (!PointToPoint(r) || !Unfinished(r)) continue;
      const absl::Duration waited = Vouched(v, r);
      absl::Duration threshold = absl::Seconds(spec.stall_after_seconds());
      if (std::optional<absl::Duration> typical = TypicalDuration(ranks, r.fingerprint().tag())) {
        threshold = std::max(threshold, *typical * 10);
      }
      if (waited <= threshold) continue;
      for (const Side& side : SidesOf(r)) {
        const RankView* peer = FindView(ranks, side.peer);
        if (peer == nullptr || peer->exited || named.count(side.peer) > 0) continue;
        if (Posted(*peer, v.rank, side.peer_receives, side.index)) continue;
        if (DeclaredPause(peer->hb(), spec) || now - peer->heartbeat_at > kRankSilentAfter ||
            now - peer->heartbeat_at >= waited) {
          continue;  // as in DiagnoseAbsent
        }
        named.insert(side.peer);
        v1::Diagnosis d = Make(
            v1::Diagnosis::NEVER_JOINED, {side.peer}, {v.rank}, r.seq(),
            absl::ToDoubleSeconds(waited),
            absl::StrFormat("rank %d has not posted the %s matching rank %d's %s #%d %s it "
                            "(%s); rank %d has waited %.1f s; %s",
                            side.peer, side.peer_receives ? "receive" : "send", v.rank,
                            side.peer_receives ? "send" : "receive", side.index,
                            side.peer_receives ? "to" : "from", Describe(r.fingerprint()), v.rank,
                            absl::ToDoubleSeconds(waited), Doing(side.peer, peer->hb())));
        *d.mutable_fingerprint() = r.fingerprint();
        out.push_back(std::move(d));
      }
    }
  }
}

// STRAGGLER: in synchronous training every rank's step takes as long as the
// slowest, so compare the compute part (step minus waiting for gradients),
// averaged over the last reporting interval. A rank must also cost the
// others a noticeable time per step: ratios of sub-millisecond steps are
// scheduling noise.
void DiagnoseStragglers(const v1::HangDetectionSpec& spec, const std::vector<RankView>& ranks,
                        std::vector<v1::Diagnosis>& out) {
  constexpr double kMinStragglerExcessSeconds = 0.02;
  std::vector<std::pair<double, int>> step_times;
  std::vector<double> waits;
  for (const RankView& v : ranks) {
    if (!v.exited && v.hb().timings().compute_seconds() > 0) {
      step_times.emplace_back(v.hb().timings().compute_seconds(), v.rank);
    }
    const bool known = !v.exited && v.has_heartbeat && v.hb().has_timings();
    waits.push_back(known ? v.hb().timings().comm_wait_seconds() : -1);
  }
  if (step_times.size() < 2) return;
  std::map<int, double> caused;
  const std::vector<double> by = WaitCausedBy(waits);
  for (size_t i = 0; i < ranks.size(); ++i) caused[ranks[i].rank] = by[i];
  std::vector<std::pair<double, int>> sorted = step_times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[(sorted.size() - 1) / 2].first;
  for (const auto& [seconds, rank] : step_times) {
    if (median <= 0 || seconds <= median * spec.straggler_ratio() ||
        seconds - median < kMinStragglerExcessSeconds) {
      continue;
    }
    const double waited = caused[rank];
    out.push_back(
        Make(v1::Diagnosis::STRAGGLER, {rank}, {}, 0, seconds,
             absl::StrFormat(
                 "rank %d computes for %.3f s per step, %.1fx the median %.3f s; the "
                 "others wait for it%s",
                 rank, seconds, seconds / median, median,
                 waited > 0 ? absl::StrFormat(" (%.3f s per step between them)", waited) : "")));
  }
}

}  // namespace

std::vector<v1::Diagnosis> DiagnoseHangs(const v1::HangDetectionSpec& spec,
                                         const std::vector<RankView>& ranks, absl::Time now) {
  std::vector<v1::Diagnosis> out;
  DiagnoseDead(spec, ranks, now, out);
  DiagnoseMismatch(ranks, out);
  DiagnoseBlocked(spec, ranks, now, out);
  DiagnoseUnmatched(spec, ranks, now, out);
  DiagnoseStragglers(spec, ranks, out);
  return out;
}

bool IsWarningOnly(v1::Diagnosis::Kind kind) {
  return kind == v1::Diagnosis::STRAGGLER || kind == v1::Diagnosis::NODE_SLOW;
}

void VoidDuringShutdown(std::vector<v1::Diagnosis>& diagnoses) {
  diagnoses.erase(
      std::remove_if(diagnoses.begin(), diagnoses.end(),
                     [](const v1::Diagnosis& d) { return d.kind() != v1::Diagnosis::DEAD; }),
      diagnoses.end());
}

// Sum over o of max(0, wait_o - wait_r) is, over the known waits sorted,
// (the sum of the waits above wait_r) - (how many they are) * wait_r: one
// sort and a running sum, O(n log n) rather than the O(n^2) of the
// definition (268 million terms per status request at 16,384 ranks).
std::vector<double> WaitCausedBy(const std::vector<double>& wait_seconds) {
  std::vector<double> caused(wait_seconds.size(), 0.0);
  std::vector<size_t> known;
  for (size_t r = 0; r < wait_seconds.size(); ++r) {
    if (wait_seconds[r] >= 0) known.push_back(r);
  }
  std::sort(known.begin(), known.end(),
            [&](size_t a, size_t b) { return wait_seconds[a] > wait_seconds[b]; });
  double above_sum = 0;  // waits strictly greater than the current one
  size_t above = 0;
  for (size_t i = 0; i < known.size();) {
    const double w = wait_seconds[known[i]];
    size_t j = i;  // ranks with the same wait cause nothing to one another
    while (j < known.size() && wait_seconds[known[j]] == w) ++j;
    for (size_t k = i; k < j; ++k) {
      caused[known[k]] = above_sum - static_cast<double>(above) * w;
    }
    above_sum += w * static_cast<double>(j - i);
    above += j - i;
    i = j;
  }
  return caused;
}

}  // namespace chorus
