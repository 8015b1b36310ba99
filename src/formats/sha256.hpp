// SHA-256 (FIPS 180-4), streaming, for checksums of tensor bytes. No external crypto library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gdskit::formats {

class sha256 {
 public:
  sha256() noexcept { reset(); }
  void reset() noexcept;
  /// Feeds `nbytes` bytes; may be called any number of times.
  void update(const void* data, std::size_t nbytes) noexcept;
  /// Finishes and returns the 32-byte digest; the object must be reset() before reuse.
  std::array<std::uint8_t, 32> finish() noexcept;
  /// finish() as 64 lowercase hex digits.
  std::string finish_hex();

  /// One-shot digest of a buffer as lowercase hex.
  static std::string hex(const void* data, std::size_t nbytes);

 private:
  void compress(const std::uint8_t* block) noexcept;

  std::array<std::uint32_t, 8> state_{};
  std::array<std::uint8_t, 64> block_{};
  std::size_t block_used_ = 0;
  std::uint64_t total_bytes_ = 0;
};

}  // namespace gdskit::formats
