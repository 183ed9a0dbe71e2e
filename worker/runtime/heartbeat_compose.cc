#include "worker/runtime/heartbeat_compose.h"

namespace chorus {

v1::CollectiveRecord ToProto(const FlightRecord& r) {
  v1::CollectiveRecord out;
  out.set_seq(r.seq);
  v1::CollectiveFingerprint* fp = out.mutable_fingerprint();
  fp->set_op(r.fingerprint.op);
  fp->set_tag(r.fingerprint.tag);
  fp->set_dtype(r.fingerprint.dtype);
  fp->set_count(r.fingerprint.count);
  fp->set_bytes(r.fingerprint.bytes());
  for (int g : r.fingerprint.group) fp->add_group(g);
  switch (r.state) {
    case OpState::kEnqueued:
      out.set_state(v1::CollectiveRecord::ENQUEUED);
      break;
    case OpState::kStarted:
      out.set_state(v1::CollectiveRecord::STARTED);
      break;
    case OpState::kRunning:
      out.set_state(v1::CollectiveRecord::RUNNING);
      break;
    case OpState::kCompleted:
      out.set_state(v1::CollectiveRecord::COMPLETED);
      break;
    default:
      out.set_state(v1::CollectiveRecord::FAILED);
      break;
  }
  auto us = [](absl::Time t) { return t == absl::InfinitePast() ? 0 : absl::ToUnixMicros(t); };
  out.set_enqueued_us(us(r.enqueued));
  out.set_started_us(us(r.started));
  out.set_running_us(us(r.running));
  out.set_completed_us(us(r.finished));
  out.set_collective_index(r.index.collective);
  if (r.index.send > 0) {
    out.set_send_index(r.index.send);
    out.set_send_to(r.index.send_to);
  }
  if (r.index.recv > 0) {
    out.set_recv_index(r.index.recv);
    out.set_recv_from(r.index.recv_from);
  }
  return out;
}

v1::FlightRecorderSummary SummarizeFlightRecorder(const FlightRecorder& recorder, int recent) {
  FlightRecorder::Snapshot snap = recorder.TakeSnapshot(recent);
  v1::FlightRecorderSummary fr;
  fr.set_last_enqueued_seq(snap.last_enqueued_seq);
  fr.set_last_started_seq(snap.last_started_seq);
  fr.set_last_completed_seq(snap.last_completed_seq);
  fr.set_collectives_enqueued(snap.collectives_enqueued);
  fr.set_device(recorder.device());
  for (const FlightRecord& r : snap.in_flight) *fr.add_records() = ToProto(r);
  for (const FlightRecord& r : snap.recent) *fr.add_records() = ToProto(r);
  return fr;
}

v1::RankHeartbeat ProgressHeartbeat(const TrainingProgress& progress,
                                    const FlightRecorder* recorder, absl::Time now) {
  v1::RankHeartbeat hb;
  hb.set_step(progress.step.load());
  hb.set_epoch(progress.epoch.load());
  hb.set_phase(static_cast<v1::Phase>(progress.phase.load()));
  const int64_t now_us = absl::ToUnixMicros(now);
  // Zero until training publishes its first phase.
  const int64_t since_us = progress.phase_since_us.load();
  hb.set_phase_seconds(since_us > 0 ? (now_us - since_us) / 1e6 : 0.0);
  hb.mutable_timings()->set_step_seconds(progress.step_seconds.load());
  hb.mutable_timings()->set_compute_seconds(progress.compute_seconds.load());
  hb.mutable_timings()->set_comm_wait_seconds(progress.comm_wait_seconds.load());
  hb.set_loss(progress.loss.load());
  hb.set_samples_per_second(progress.samples_per_second.load());
  if (recorder != nullptr) *hb.mutable_flight_recorder() = SummarizeFlightRecorder(*recorder);
  return hb;
}

v1::RankHeartbeat ComposeHeartbeat(const v1::JoinResponse& joined, const std::string& job_id,
                                   const Communicator& comm, const TrainingProgress& progress,
                                   absl::Time now) {
  v1::RankHeartbeat hb = ProgressHeartbeat(progress, &comm.flight_recorder(), now);
  hb.set_job_id(job_id);
  hb.set_generation(joined.generation());
  hb.set_rank(joined.rank());
  hb.set_time_us(absl::ToUnixMicros(now));
  return hb;
}

}  // namespace chorus
