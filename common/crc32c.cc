#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace chorus {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // Castagnoli, bit-reversed

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

// `state` is the inverted running value (the CRC's internal register).
uint32_t ExtendPortable(uint32_t state, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) state = table[(state ^ p[i]) & 0xff] ^ (state >> 8);
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t state, const unsigned char* p,
                                                       size_t n) {
  uint64_t s = state;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    s = _mm_crc32_u64(s, word);
    p += 8;
    n -= 8;
  }
  uint32_t s32 = static_cast<uint32_t>(s);
  while (n > 0) {
    s32 = _mm_crc32_u8(s32, *p++);
    --n;
  }
  return s32;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, absl::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  uint32_t state = ~crc;
#if defined(__x86_64__)
  if (HasSse42()) return ~ExtendSse42(state, p, bytes.size());
#endif
  return ~ExtendPortable(state, p, bytes.size());
}

namespace {

// Polynomials over GF(2) modulo the CRC polynomial, in the CRC's reflected
// bit order: bit 31 is the coefficient of x^0, bit 0 that of x^31.
constexpr uint32_t kOne = 1u << 31;

uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = kOne; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolynomial : b >> 1;  // b *= x
  }
  return product;
}

// x^(2^k) mod P for k = 0..63.
const std::array<uint32_t, 64>& PowersOfX() {
  static const std::array<uint32_t, 64> powers = [] {
    std::array<uint32_t, 64> p{};
    p[0] = kOne >> 1;  // x^1
    for (size_t k = 1; k < p.size(); ++k) p[k] = MultiplyModP(p[k - 1], p[k - 1]);
    return p;
  }();
  return powers;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // Appending n bytes multiplies A's remainder by x^(8n); the conditioning
  // (initial and final inversion) of both CRCs cancels in the sum.
  uint32_t shift = kOne;  // x^0
  const std::array<uint32_t, 64>& powers = PowersOfX();
  for (size_t k = 3; length_b != 0 && k < powers.size(); ++k, length_b >>= 1) {
    if (length_b & 1) shift = MultiplyModP(powers[k], shift);
  }
  return MultiplyModP(shift, crc_a) ^ crc_b;
}

}  // namespace chorus
