// Small arithmetic and timing helpers every part of the core uses.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace gdskit {

/// `v` rounded down to a multiple of `a` (a > 0).
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a) noexcept { return v / a * a; }
/// `v` rounded up to a multiple of `a` (a > 0; the caller keeps v + a - 1 within 64 bits).
constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) noexcept { return (v + a - 1) / a * a; }

/// Seconds from `t0` to now, on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gdskit
