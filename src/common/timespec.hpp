// A duration as the timespec that poll-style system calls take.
#pragma once
#include <time.h>

#include <chrono>

namespace gdskit {

/// `d` (not negative) as seconds and nanoseconds.
inline timespec to_timespec(std::chrono::nanoseconds d) noexcept {
  return {static_cast<time_t>(d.count() / 1'000'000'000), static_cast<long>(d.count() % 1'000'000'000)};
}

}  // namespace gdskit
