#include "gdskit/settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "gdskit/error.hpp"

namespace gdskit {
namespace {

[[noreturn]] void bad_setting(std::string_view name, std::string_view value, std::string_view why) {
  throw error(errno_code(EINVAL), fmt::format("setting {}=\"{}\": {}", name, value, why));
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  auto parsed = parse_size(v);
  if (!parsed) bad_setting(name, v, "expected a byte count such as 4194304, 4M or 1G");
  return static_cast<std::size_t>(*parsed);
}

unsigned env_unsigned(const char* name, unsigned fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  unsigned out = 0;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc{} || p != s.data() + s.size()) bad_setting(name, v, "expected a whole number");
  return out;
}

template <class E>
E env_enum(const char* name, E fallback, std::optional<E> (*parse)(std::string_view) noexcept, const char* allowed) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  auto parsed = parse(v);
  if (!parsed) bad_setting(name, v, fmt::format("expected one of {}", allowed));
  return *parsed;
}

std::optional<bool> parse_switch(std::string_view t) noexcept {
  if (t == "on" || t == "1" || t == "true") return true;
  if (t == "off" || t == "0" || t == "false") return false;
  return std::nullopt;
}

// Throws for the first field out of range. The message names the field, or with `env_names` the GDSKIT_*
// variable it was read from, so that a bad environment names what the user has to change.
void check_ranges(const settings& s, bool env_names) {
  auto fail = [env_names](std::string_view field, std::string_view variable, auto value, std::string_view why) {
    bad_setting(env_names ? variable : field, fmt::format("{}", value), why);
  };
  if (s.threads < 1 || s.threads > 1024) fail("threads", "GDSKIT_THREADS", s.threads, "must be 1..1024");
  if (s.direct_depth < 1 || s.direct_depth > 1024) {
    fail("direct_depth", "GDSKIT_DIRECT_DEPTH", s.direct_depth, "must be 1..1024");
  }
  // io_uring and pread move at most 2 GiB - 4 KiB per call; 1 GiB keeps every chunk one call.
  if (s.chunk_bytes < 4096 || s.chunk_bytes % 4096 != 0 || s.chunk_bytes > (std::size_t{1} << 30)) {
    fail("chunk_bytes", "GDSKIT_CHUNK_BYTES", s.chunk_bytes, "must be a multiple of 4096, at most 1 GiB");
  }
  if (s.staging_slots < 2) {
    fail("staging_slots", "GDSKIT_STAGING_SLOTS", s.staging_slots, "must be at least 2 (reads run ahead of copies)");
  }
  struct slot_size {
    const char* field;
    const char* variable;
    std::size_t bytes;
  };
  for (const slot_size& v : {slot_size{"staging_slot_bytes", "GDSKIT_STAGING_SLOT_BYTES", s.staging_slot_bytes},
                             slot_size{"cached_slot_bytes", "GDSKIT_CACHED_SLOT_BYTES", s.cached_slot_bytes}}) {
    if (v.bytes < 65536 || v.bytes % 4096 != 0 || v.bytes > (std::size_t{1} << 30)) {
      fail(v.field, v.variable, v.bytes, "must be 64 KiB..1 GiB and a multiple of 4096");
    }
  }
}

}  // namespace

settings settings::from_env() {
  settings s;
  // One worker per core reads well from page cache; O_DIRECT on NVMe wants depth, so never fewer than 4.
  unsigned hw = std::thread::hardware_concurrency();
  s.threads = std::clamp(hw == 0 ? 8u : hw, 4u, 16u);
  s.threads = env_unsigned("GDSKIT_THREADS", s.threads);
  s.direct_depth = env_unsigned("GDSKIT_DIRECT_DEPTH", s.direct_depth);
  s.chunk_bytes = env_size("GDSKIT_CHUNK_BYTES", s.chunk_bytes);
  s.inline_bytes = env_size("GDSKIT_INLINE_BYTES", s.inline_bytes);
  s.direct = env_enum("GDSKIT_DIRECT", s.direct, &parse_direct_mode, "auto, on, off");
  s.engine = env_enum("GDSKIT_ENGINE", s.engine, &parse_engine_kind, "auto, io_uring, threads");
  s.mode = env_enum("GDSKIT_MODE", s.mode, &parse_path_mode, "auto, gds, staged, compat, host");
  s.staging_slots = env_unsigned("GDSKIT_STAGING_SLOTS", s.staging_slots);
  s.staging_slot_bytes = env_size("GDSKIT_STAGING_SLOT_BYTES", s.staging_slot_bytes);
  s.cached_slot_bytes = env_size("GDSKIT_CACHED_SLOT_BYTES", s.cached_slot_bytes);
  s.adaptive = env_enum("GDSKIT_ADAPTIVE", s.adaptive, &parse_switch, "on, off");
  s.learn = env_enum("GDSKIT_LEARN", s.learn, &parse_switch, "on, off");
  s.direct_depth_set = env("GDSKIT_DIRECT_DEPTH") != nullptr;
  s.chunk_bytes_set = env("GDSKIT_CHUNK_BYTES") != nullptr;
  s.staging_slot_bytes_set = env("GDSKIT_STAGING_SLOT_BYTES") != nullptr;
  check_ranges(s, true);
  return s;
}

void settings::validate() const { check_ranges(*this, false); }

settings& default_settings() {
  static settings instance = settings::from_env();
  return instance;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  std::size_t num_end = 0;
  while (num_end < text.size() && (std::isdigit(static_cast<unsigned char>(text[num_end])) || text[num_end] == '.')) {
    ++num_end;
  }
  if (num_end == 0) return std::nullopt;
  std::string_view number = text.substr(0, num_end);
  std::string_view unit = text.substr(num_end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  std::uint64_t mult = 1;
  if (!unit.empty()) {
    char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit.front())));
    std::string_view rest = unit.substr(1);
    switch (u) {
      case 'B': mult = 1; rest = unit.substr(0, 0); if (unit.size() != 1) return std::nullopt; break;
      case 'K': mult = 1ull << 10; break;
      case 'M': mult = 1ull << 20; break;
      case 'G': mult = 1ull << 30; break;
      case 'T': mult = 1ull << 40; break;
      default: return std::nullopt;
    }
    if (!(rest.empty() || rest == "B" || rest == "b" || rest == "iB" || rest == "ib" || rest == "IB")) return std::nullopt;
  }
  if (number.find('.') == std::string_view::npos) {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec != std::errc{} || p != number.data() + number.size()) return std::nullopt;
    if (mult != 1 && v > UINT64_MAX / mult) return std::nullopt;
    return v * mult;
  }
  double d = 0;
  try {
    std::size_t used = 0;
    d = std::stod(std::string(number), &used);
    if (used != number.size()) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  long double total = static_cast<long double>(d) * mult;
  if (!(total >= 0) || total > 1.8e19L) return std::nullopt;
  return static_cast<std::uint64_t>(std::llround(static_cast<double>(total)));
}

std::string format_size(std::uint64_t nbytes) {
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (nbytes < 1024) return fmt::format("{} B", nbytes);
  double v = static_cast<double>(nbytes);
  int i = -1;
  while (v >= 1024 && i < 3) {
    v /= 1024;
    ++i;
  }
  return fmt::format("{:.2f} {}", v, units[i]);
}

std::string_view to_string(direct_mode m) noexcept {
  switch (m) {
    case direct_mode::on: return "on";
    case direct_mode::off: return "off";
    default: return "auto";
  }
}
std::string_view to_string(engine_kind e) noexcept {
  switch (e) {
    case engine_kind::io_uring: return "io_uring";
    case engine_kind::threads: return "threads";
    default: return "auto";
  }
}
std::string_view to_string(path_mode m) noexcept {
  switch (m) {
    case path_mode::gds: return "gds";
    case path_mode::staged: return "staged";
    case path_mode::compat: return "compat";
    case path_mode::host: return "host";
    default: return "auto";
  }
}
std::optional<direct_mode> parse_direct_mode(std::string_view t) noexcept {
  if (t == "auto") return direct_mode::automatic;
  if (t == "on" || t == "1" || t == "true") return direct_mode::on;
  if (t == "off" || t == "0" || t == "false") return direct_mode::off;
  return std::nullopt;
}
std::optional<engine_kind> parse_engine_kind(std::string_view t) noexcept {
  if (t == "auto") return engine_kind::automatic;
  if (t == "io_uring" || t == "uring") return engine_kind::io_uring;
  if (t == "threads") return engine_kind::threads;
  return std::nullopt;
}
std::optional<path_mode> parse_path_mode(std::string_view t) noexcept {
  if (t == "auto") return path_mode::automatic;
  if (t == "gds") return path_mode::gds;
  if (t == "staged") return path_mode::staged;
  if (t == "compat") return path_mode::compat;
  if (t == "host") return path_mode::host;
  return std::nullopt;
}

}  // namespace gdskit
