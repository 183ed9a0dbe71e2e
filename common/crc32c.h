// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata and gRPC's
// own framing checks: cheap enough to run over every byte of a checkpoint
// in transit (SSE4.2's crc32 instruction where the CPU has it, three
// chains of it side by side; a table otherwise). It detects damage, not tampering. Checkpoint
// manifests record each file's size and CRC-32C.
//
// Thread-safe (no shared state after the first call).
//
// Example:
//   uint32_t crc = Crc32c("123456789");          // 0xe3069283
//   uint32_t running = Crc32cExtend(0, part1);
//   running = Crc32cExtend(running, part2);      // == Crc32c(part1 + part2)
//   Crc32cCombine(Crc32c(part1), Crc32c(part2), part2.size())  // the same
#ifndef CHORUS_COMMON_CRC32C_H_
#define CHORUS_COMMON_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace chorus {

// The CRC-32C of the bytes that gave `crc` followed by `bytes`.
uint32_t Crc32cExtend(uint32_t crc, absl::string_view bytes);

inline uint32_t Crc32c(absl::string_view bytes) { return Crc32cExtend(0, bytes); }

// The CRC-32C of A followed by B from A's CRC, B's CRC and B's length,
// without the bytes (O(log length) work): a receiver that checks each
// piece's CRC gets the whole file's for free.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

}  // namespace chorus

#endif  // CHORUS_COMMON_CRC32C_H_
