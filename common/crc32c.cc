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

// Polynomials over GF(2) modulo the CRC polynomial, in the CRC's reflected
// bit order: bit 31 is the coefficient of x^0, bit 0 that of x^31. A CRC
// register is such a polynomial, and running n zero bytes through it
// multiplies it by x^(8n).
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

// x^(8 * bytes) mod P: what `bytes` zero bytes multiply a register by.
uint32_t ZeroBytesShift(uint64_t bytes) {
  uint32_t shift = kOne;  // x^0
  const std::array<uint32_t, 64>& powers = PowersOfX();
  for (size_t k = 3; bytes != 0 && k < powers.size(); ++k, bytes >>= 1) {
    if (bytes & 1) shift = MultiplyModP(powers[k], shift);
  }
  return shift;
}

#if defined(__x86_64__)
// Note [Three crc32 streams]
// The crc32 instruction takes 3 cycles and a new one can start every
// cycle, so one dependent chain of them runs at a third of the unit's
// speed (~5 GB/s measured on 200 MB checkpoints; the rank and the
// coordinator each checksum every byte). ExtendSse42 cuts each block of
// 3 x kStripe bytes into three stripes, runs one chain per stripe side by
// side, and joins them: the register after A|B|C is
//   A's * x^(16 kStripe) + B's * x^(8 kStripe) + C's
// (B's and C's started from zero). Multiplying by those two fixed powers is
// linear in the register's 32 bits, so it is four lookups per power in
// tables built once (Shifter).
constexpr size_t kStripe = 4096;

// Multiplication by one fixed polynomial, a byte of the register at a time.
class Shifter {
 public:
  explicit Shifter(uint32_t by) {
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) table_[k][b] = MultiplyModP(b << (8 * k), by);
    }
  }
  uint32_t operator()(uint32_t v) const {
    return table_[0][v & 0xff] ^ table_[1][(v >> 8) & 0xff] ^ table_[2][(v >> 16) & 0xff] ^
           table_[3][v >> 24];
  }

 private:
  uint32_t table_[4][256];
};

__attribute__((target("sse4.2"))) uint64_t Chain(uint64_t s, const unsigned char* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    s = _mm_crc32_u64(s, word);
  }
  uint32_t s32 = static_cast<uint32_t>(s);
  for (; n > 0; ++p, --n) s32 = _mm_crc32_u8(s32, *p);
  return s32;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t state, const unsigned char* p,
                                                       size_t n) {
  static const Shifter by_one_stripe(ZeroBytesShift(kStripe));
  static const Shifter by_two_stripes(ZeroBytesShift(2 * kStripe));
  uint64_t s = state;
  for (; n >= 3 * kStripe; p += 3 * kStripe, n -= 3 * kStripe) {
    uint64_t a = s;
    uint64_t b = 0;
    uint64_t c = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kStripe + i, 8);
      std::memcpy(&wc, p + 2 * kStripe + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      c = _mm_crc32_u64(c, wc);
    }
    s = by_two_stripes(static_cast<uint32_t>(a)) ^ by_one_stripe(static_cast<uint32_t>(b)) ^
        static_cast<uint32_t>(c);
  }
  return static_cast<uint32_t>(Chain(s, p, n));
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

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // Appending n bytes multiplies A's remainder by x^(8n); the conditioning
  // (initial and final inversion) of both CRCs cancels in the sum.
  return MultiplyModP(ZeroBytesShift(length_b), crc_a) ^ crc_b;
}

}  // namespace chorus
