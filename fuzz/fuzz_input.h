// FuzzInput: reads a fuzzer's input bytes as a sequence of small values, so
// one byte string can drive a sequence of calls (which format, which
// request, how long a wait). Every read is defined for every input: past the
// end, numbers read as 0 and byte strings as empty.
//
// Thread-compatible; it only looks at the bytes it was given, which must
// outlive it.
//
// Example:
//   FuzzInput in(data, size);
//   const uint8_t op = in.Byte();
//   const std::string request = in.Bytes(in.U16());  // a length-prefixed record
//   const std::string rest = in.Rest();
#ifndef CHORUS_FUZZ_FUZZ_INPUT_H_
#define CHORUS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return next_ == size_; }
  size_t remaining() const { return size_ - next_; }

  uint8_t Byte() { return next_ < size_ ? data_[next_++] : 0; }
  // Little-endian.
  uint16_t U16() { return static_cast<uint16_t>(Little(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Little(4)); }
  uint64_t U64() { return Little(8); }
  // Up to `n` bytes (fewer at the end of the input).
  std::string Bytes(size_t n) {
    if (n > remaining()) n = remaining();
    std::string out(reinterpret_cast<const char*>(data_ + next_), n);
    next_ += n;
    return out;
  }
  std::string Rest() { return Bytes(remaining()); }

 private:
  uint64_t Little(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(Byte()) << (8 * i);
    return v;
  }

  const uint8_t* const data_;
  const size_t size_;
  size_t next_ = 0;
};

}  // namespace chorus

#endif  // CHORUS_FUZZ_FUZZ_INPUT_H_
