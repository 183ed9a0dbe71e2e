#include "worker/runtime/join_generation.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"

namespace chorus {

absl::StatusOr<v1::JoinResponse> JoinGeneration(v1::RankService::StubInterface& ranks,
                                                const v1::JoinRequest& request, absl::Time deadline,
                                                bool until_formed) {
  for (;;) {
    v1::JoinResponse joined;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(true);
    absl::Status s = FromGrpcStatus(ranks.Join(&context, request, &joined));
    if (s.ok()) return joined;
    const bool again = until_formed && (absl::IsUnavailable(s) || absl::IsAborted(s));
    if (!again || absl::Now() + absl::Milliseconds(100) >= deadline) {
      return absl::Status(s.code(), absl::StrCat("joining generation ", request.generation(),
                                                 " of ", request.job_id(), ": ", s.message()));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace chorus
