#include "checkpoint/storage.h"

#include "common/status_macros.h"

namespace chorus {

absl::StatusOr<CheckpointFileData> ReadAll(const CheckpointFileSource& source) {
  CheckpointFileData data;
  data.name = source.name;
  RETURN_IF_ERROR(source.write([&data](absl::string_view piece) {
    data.bytes.append(piece.data(), piece.size());
    return absl::OkStatus();
  }));
  return data;
}

}  // namespace chorus
