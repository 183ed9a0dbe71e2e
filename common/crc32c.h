// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 metadata and gRPC's
// own framing checks: cheap enough to run over every byte of a checkpoint
// in transit (SSE4.2's crc32 instruction where the CPU has it, ~8 GB/s per
// core; a table otherwise). It detects transmission damage, not tampering;
// stored checkpoint files are also recorded with their SHA-256.
//
// Thread-safe (no shared state after the first call).
//
// Example:
//   uint32_t crc = Crc32c("123456789");          // 0xe3069283
//   uint32_t running = Crc32cExtend(0, part1);
//   running = Crc32cExtend(running, part2);      // == Crc32c(part1 + part2)
#ifndef CHORUS_COMMON_CRC32C_H_
#define CHORUS_COMMON_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace chorus {

// The CRC-32C of the bytes that gave `crc` followed by `bytes`.
uint32_t Crc32cExtend(uint32_t crc, absl::string_view bytes);

inline uint32_t Crc32c(absl::string_view bytes) { return Crc32cExtend(0, bytes); }

}  // namespace chorus

#endif  // CHORUS_COMMON_CRC32C_H_
