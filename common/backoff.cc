#include "common/backoff.h"

#include <algorithm>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace chorus {

// Note [Backoff]
// Every loop that tries a peer again (an agent reconnecting to the
// coordinator, a rank's heartbeat stream, a join, the rendezvous store, the
// etcd client, a checkpoint upload, a standby's campaign) waits a Backoff's
// delay between attempts. Two properties matter:
//  - It grows. A peer that stays away (a coordinator restarting, etcd
//    without quorum) is asked less and less often, up to a cap chosen per
//    loop close to the fixed delay the loop had before, so that a peer
//    that comes back is found about as soon as before.
//  - It is random. After a failover every agent and every rank lost the
//    coordinator at the same instant; with fixed or purely exponential
//    delays they all come back at the same instants, in bursts the new
//    leader has to absorb at once. The idea and the comparison of the
//    variants are from AWS's architecture blog post "Exponential Backoff
//    And Jitter" (Marc Brooker): randomizing each delay spreads the
//    clients over the window.
// Of that post's variants we use "equal jitter": a delay is drawn
// uniformly from [ceiling/2, ceiling] rather than "full jitter"'s
// [0, ceiling]. Full jitter spreads a little more, but it can draw delays
// near zero, which turns loops whose attempts fail at once (a refused
// connection, a closed socket) into bursts of back-to-back attempts, and it
// makes no promise about the least time between two attempts. Equal jitter
// keeps half the window as a floor and still spreads clients over the
// other half; its mean (3/4 of the ceiling) also keeps every loop at least
// as quick to notice a returning peer as its old fixed delay (the ceiling).
// `jitter` sets the random share (0.5 here; 1 would be full jitter, 0 none).

namespace {

uint64_t EntropySeed() {
  std::random_device device;
  const uint64_t drawn = (static_cast<uint64_t>(device()) << 32) ^ device();
  // random_device may be deterministic on some platforms: mix in what
  // differs between processes started together.
  return drawn ^ static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^
         (static_cast<uint64_t>(::getpid()) << 40);
}

}  // namespace

absl::Status ValidateBackoffOptions(const BackoffOptions& options) {
  if (options.initial <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff: initial must be > 0, got ", absl::FormatDuration(options.initial)));
  }
  if (options.max < options.initial) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff: max (", absl::FormatDuration(options.max),
                     ") must be >= initial (", absl::FormatDuration(options.initial), ")"));
  }
  if (!(options.multiplier >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff: multiplier must be >= 1, got ", options.multiplier));
  }
  if (!(options.jitter >= 0.0 && options.jitter <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff: jitter must be in [0, 1], got ", options.jitter));
  }
  return absl::OkStatus();
}

Backoff::Backoff(BackoffOptions options) : Backoff(options, EntropySeed()) {}

Backoff::Backoff(BackoffOptions options, uint64_t seed)
    : options_(options), random_(seed), ceiling_(options.initial) {}

absl::Duration Backoff::Next() {
  const absl::Duration ceiling = ceiling_;
  ceiling_ = std::min(ceiling_ * options_.multiplier, options_.max);
  ++retries_;
  if (options_.jitter <= 0.0) return ceiling;
  std::uniform_real_distribution<double> share(1.0 - options_.jitter, 1.0);
  return ceiling * share(random_);
}

absl::Duration Backoff::NextWithin(absl::Time deadline, absl::Time now) {
  return std::max(absl::ZeroDuration(), std::min(Next(), deadline - now));
}

void Backoff::Reset() {
  ceiling_ = options_.initial;
  retries_ = 0;
}

}  // namespace chorus
