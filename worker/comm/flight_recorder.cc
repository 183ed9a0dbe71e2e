#include "worker/comm/flight_recorder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace chorus {
namespace {

int64_t DtypeSize(const std::string& dtype) {
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float16" || dtype == "bfloat16") return 2;
  if (dtype == "uint8" || dtype == "int8" || dtype == "bool") return 1;
  return 0;
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonTime(absl::Time t) {
  return t == absl::InfinitePast() ? "null" : absl::StrCat(absl::ToUnixMicros(t));
}

}  // namespace

int64_t Fingerprint::bytes() const { return count * DtypeSize(dtype); }

std::string Fingerprint::ToString() const {
  std::string s = op;
  if (!dtype.empty()) absl::StrAppend(&s, " ", dtype, "[", count, "]");
  if (!group.empty()) absl::StrAppend(&s, " group{", absl::StrJoin(group, ","), "}");
  if (!tag.empty()) absl::StrAppend(&s, " ", tag);
  return s;
}

bool Fingerprint::operator==(const Fingerprint& other) const {
  return op == other.op && dtype == other.dtype && count == other.count && group == other.group &&
         tag == other.tag;
}

const char* OpStateName(OpState state) {
  switch (state) {
    case OpState::kEnqueued:
      return "enqueued";
    case OpState::kStarted:
      return "started";
    case OpState::kRunning:
      return "running";
    case OpState::kCompleted:
      return "completed";
    case OpState::kFailed:
      return "failed";
    case OpState::kTimedOut:
      return "timed_out";
  }
  return "unknown";
}

FlightRecorder::FlightRecorder(size_t capacity, Clock* clock, std::string device)
    : clock_(clock != nullptr ? clock : &real_clock_),
      device_(std::move(device)),
      ring_(std::max<size_t>(capacity, 1)) {}

FlightRecord* FlightRecorder::Find(int64_t seq) {
  if (seq <= 0) return nullptr;
  FlightRecord& r = ring_[static_cast<size_t>(seq) % ring_.size()];
  return r.seq == seq ? &r : nullptr;
}

const FlightRecord* FlightRecorder::Find(int64_t seq) const {
  if (seq <= 0) return nullptr;
  const FlightRecord& r = ring_[static_cast<size_t>(seq) % ring_.size()];
  return r.seq == seq ? &r : nullptr;
}

namespace {

bool IsFinished(OpState state) {
  return state == OpState::kCompleted || state == OpState::kFailed ||
         state == OpState::kTimedOut;
}

}  // namespace

int64_t FlightRecorder::Enqueued(Fingerprint fingerprint, OpIndex index) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  const int64_t seq = ++last_enqueued_;
  collectives_enqueued_ = std::max(collectives_enqueued_, index.collective);
  FlightRecord& r = ring_[static_cast<size_t>(seq) % ring_.size()];
  r = FlightRecord();
  r.seq = seq;
  r.fingerprint = std::move(fingerprint);
  r.index = index;
  r.enqueued = now;
  return seq;
}

void FlightRecorder::Started(int64_t seq) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  last_started_ = std::max(last_started_, seq);
  if (FlightRecord* r = Find(seq)) {
    r->state = OpState::kStarted;
    r->started = now;
  }
}

void FlightRecorder::Running(int64_t seq) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (FlightRecord* r = Find(seq); r != nullptr && r->state == OpState::kStarted) {
    r->state = OpState::kRunning;
    r->running = now;
  }
}

void FlightRecorder::Finished(int64_t seq, OpState state, std::string error) {
  DCHECK(state == OpState::kCompleted || state == OpState::kFailed || state == OpState::kTimedOut);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  last_finished_ = std::max(last_finished_, seq);
  if (state == OpState::kCompleted) last_completed_ = std::max(last_completed_, seq);
  if (FlightRecord* r = Find(seq)) {
    r->state = state;
    r->finished = now;
    r->error = std::move(error);
  }
  while (first_unfinished_ <= last_enqueued_) {
    const FlightRecord* r = Find(first_unfinished_);
    if (r != nullptr && !IsFinished(r->state)) break;
    ++first_unfinished_;
  }
}

FlightRecorder::Snapshot FlightRecorder::TakeSnapshot(size_t recent) const {
  absl::MutexLock lock(&mu_);
  Snapshot s;
  s.last_enqueued_seq = last_enqueued_;
  s.last_started_seq = last_started_;
  s.last_finished_seq = last_finished_;
  s.last_completed_seq = last_completed_;
  s.collectives_enqueued = collectives_enqueued_;
  const int64_t oldest =
      std::max<int64_t>(1, last_enqueued_ - static_cast<int64_t>(ring_.size()) + 1);
  // Usually every op after last_finished_; a point-to-point op still waiting
  // for its peer may be older.
  for (int64_t seq = std::max(oldest, first_unfinished_); seq <= last_enqueued_; ++seq) {
    const FlightRecord* r = Find(seq);
    if (r != nullptr && !IsFinished(r->state)) s.in_flight.push_back(*r);
  }
  const int64_t first_recent = std::max(oldest, last_finished_ - static_cast<int64_t>(recent) + 1);
  for (int64_t seq = first_recent; seq <= last_finished_; ++seq) {
    const FlightRecord* r = Find(seq);
    if (r != nullptr && IsFinished(r->state)) s.recent.push_back(*r);
  }
  return s;
}

std::string FlightRecorder::DumpJson() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrCat("{\"last_enqueued_seq\":", last_enqueued_,
                                 ",\"last_started_seq\":", last_started_,
                                 ",\"last_finished_seq\":", last_finished_,
                                 ",\"last_completed_seq\":", last_completed_, ",\"entries\":[");
  const int64_t oldest =
      std::max<int64_t>(1, last_enqueued_ - static_cast<int64_t>(ring_.size()) + 1);
  bool first = true;
  for (int64_t seq = oldest; seq <= last_enqueued_; ++seq) {
    const FlightRecord* r = Find(seq);
    if (r == nullptr) continue;
    if (!first) out += ",";
    first = false;
    absl::StrAppend(
        &out, "{\"seq\":", r->seq, ",\"op\":", JsonString(r->fingerprint.op),
        ",\"dtype\":", JsonString(r->fingerprint.dtype), ",\"count\":", r->fingerprint.count,
        ",\"group\":[", absl::StrJoin(r->fingerprint.group, ","),
        "],\"tag\":", JsonString(r->fingerprint.tag),
        ",\"collective_index\":", r->index.collective, ",\"send_to\":", r->index.send_to,
        ",\"send_index\":", r->index.send, ",\"recv_from\":", r->index.recv_from,
        ",\"recv_index\":", r->index.recv, ",\"state\":", JsonString(OpStateName(r->state)),
        ",\"enqueued_us\":", JsonTime(r->enqueued), ",\"started_us\":", JsonTime(r->started),
        ",\"running_us\":", JsonTime(r->running), ",\"finished_us\":", JsonTime(r->finished),
        ",\"error\":", JsonString(r->error), "}");
  }
  out += "]}";
  return out;
}

}  // namespace chorus
