#include "gdskit/settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gdskit/error.hpp"

namespace gdskit {
namespace {

// Text from the environment or a caller, safe to print: bytes outside printable ASCII as \xNN.
std::string shown(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '\\' || c == '"') {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

[[noreturn]] void bad_setting(std::string_view name, std::string_view value, std::string_view why) {
  throw error(errno_code(EINVAL), fmt::format("setting {}=\"{}\": {}", shown(name), shown(value), why));
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::optional<bool> parse_switch(std::string_view t) noexcept {
  if (t == "on" || t == "1" || t == "true") return true;
  if (t == "off" || t == "0" || t == "false") return false;
  return std::nullopt;
}

// Parsers of one value as text; `who` (the variable or the setting's name) is named when the text is refused.
unsigned parse_count(std::string_view who, std::string_view v) {
  unsigned out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc{} || p != v.data() + v.size()) bad_setting(who, v, "expected a whole number");
  return out;
}

std::size_t parse_bytes(std::string_view who, std::string_view v) {
  auto parsed = parse_size(v);
  if (!parsed) bad_setting(who, v, "expected a byte count such as 4194304, 4M or 1G");
  return static_cast<std::size_t>(*parsed);
}

template <class E>
E parse_choice(std::string_view who, std::string_view v, std::optional<E> (*parse)(std::string_view) noexcept,
               const char* allowed) {
  auto parsed = parse(v);
  if (!parsed) bad_setting(who, v, fmt::format("expected one of {}", allowed));
  return *parsed;
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
  if (s.copy_kernel_bytes < 4096 || s.copy_kernel_bytes > (std::size_t{64} << 20)) {
    fail("copy_kernel_bytes", "GDSKIT_COPY_KERNEL_BYTES", s.copy_kernel_bytes, "must be 4 KiB..64 MiB");
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

// Byte counts as set_setting takes them back: the largest binary unit that divides them ("4M", "65536").
std::string bytes_text(std::uint64_t n) {
  static constexpr std::pair<std::uint64_t, const char*> units[] = {{1ull << 30, "G"}, {1ull << 20, "M"}, {1ull << 10, "K"}};
  for (const auto& [u, suffix] : units) {
    if (n >= u && n % u == 0) return fmt::format("{}{}", n / u, suffix);
  }
  return fmt::format("{}", n);
}

// One setting: its names, how it reads, and how it is parsed into and printed from a settings object.
struct field {
  const char* name;
  const char* variable;
  setting_kind kind;
  const char* help;
  void (*parse)(settings& s, std::string_view who, std::string_view text);
  std::string (*print)(const settings& s);
};

#define GDSKIT_COUNT_FIELD(member) \
  [](settings& s, std::string_view w, std::string_view t) { s.member = parse_count(w, t); }, \
      [](const settings& s) { return fmt::format("{}", s.member); }
#define GDSKIT_BYTES_FIELD(member) \
  [](settings& s, std::string_view w, std::string_view t) { s.member = parse_bytes(w, t); }, \
      [](const settings& s) { return bytes_text(s.member); }
#define GDSKIT_SWITCH_FIELD(member) \
  [](settings& s, std::string_view w, std::string_view t) { s.member = parse_choice(w, t, &parse_switch, "on, off"); }, \
      [](const settings& s) { return std::string(s.member ? "on" : "off"); }
#define GDSKIT_CHOICE_FIELD(member, parser, allowed) \
  [](settings& s, std::string_view w, std::string_view t) { s.member = parse_choice(w, t, &parser, allowed); }, \
      [](const settings& s) { return std::string(to_string(s.member)); }

// In the order of docs/settings.md's table.
const field k_fields[] = {
    {"threads", "GDSKIT_THREADS", setting_kind::count, "workers for one large request (1..1024)",
     GDSKIT_COUNT_FIELD(threads)},
    {"adaptive", "GDSKIT_ADAPTIVE", setting_kind::on_off,
     "O_DIRECT depth and request size adapt to the device while transfers run (on, off)",
     GDSKIT_SWITCH_FIELD(adaptive)},
    {"learn", "GDSKIT_LEARN", setting_kind::on_off,
     "remember the shape the adaptive controller converged to, per device (on, off)", GDSKIT_SWITCH_FIELD(learn)},
    {"direct_depth", "GDSKIT_DIRECT_DEPTH", setting_kind::count,
     "O_DIRECT requests in flight (1..1024); set, it wins over profiles and the controller",
     GDSKIT_COUNT_FIELD(direct_depth)},
    {"chunk_bytes", "GDSKIT_CHUNK_BYTES", setting_kind::bytes,
     "host request size (4 KiB multiple, at most 1 GiB); set, it wins over profiles and the controller",
     GDSKIT_BYTES_FIELD(chunk_bytes)},
    {"inline_bytes", "GDSKIT_INLINE_BYTES", setting_kind::bytes, "requests up to this size run on the calling thread",
     GDSKIT_BYTES_FIELD(inline_bytes)},
    {"direct", "GDSKIT_DIRECT", setting_kind::choice, "O_DIRECT: auto (where accepted), on (required), off",
     GDSKIT_CHOICE_FIELD(direct, parse_direct_mode, "auto, on, off")},
    {"engine", "GDSKIT_ENGINE", setting_kind::choice, "host I/O engine: auto, io_uring, threads",
     GDSKIT_CHOICE_FIELD(engine, parse_engine_kind, "auto, io_uring, threads")},
    {"mode", "GDSKIT_MODE", setting_kind::choice, "data path for GPU memory: auto, gds, staged, compat, host",
     GDSKIT_CHOICE_FIELD(mode, parse_path_mode, "auto, gds, staged, compat, host")},
    {"staging_slots", "GDSKIT_STAGING_SLOTS", setting_kind::count, "pinned staging slots per worker (at least 2)",
     GDSKIT_COUNT_FIELD(staging_slots)},
    {"cached_slot_bytes", "GDSKIT_CACHED_SLOT_BYTES", setting_kind::bytes,
     "staging slot size for reads from the page cache (64 KiB..1 GiB, 4 KiB multiple)",
     GDSKIT_BYTES_FIELD(cached_slot_bytes)},
    {"staging_slot_bytes", "GDSKIT_STAGING_SLOT_BYTES", setting_kind::bytes,
     "staging slot size for storage (64 KiB..1 GiB, 4 KiB multiple); set, it is the staged request size",
     GDSKIT_BYTES_FIELD(staging_slot_bytes)},
    {"copy_kernel", "GDSKIT_COPY_KERNEL", setting_kind::on_off,
     "small pieces between staging and GPU memory: one copy kernel per group (on) or the copy engines (off)",
     GDSKIT_SWITCH_FIELD(copy_kernel)},
    {"copy_kernel_bytes", "GDSKIT_COPY_KERNEL_BYTES", setting_kind::bytes,
     "the largest piece the copy kernel moves (4 KiB..64 MiB); larger ones go to the copy engines",
     GDSKIT_BYTES_FIELD(copy_kernel_bytes)},
    {"registered_staging", "GDSKIT_REGISTERED_STAGING", setting_kind::on_off,
     "batch staging in io_uring's registered buffers: no page pinning per request (on) or pinning per request (off)",
     GDSKIT_SWITCH_FIELD(registered_staging)},
};
#undef GDSKIT_COUNT_FIELD
#undef GDSKIT_BYTES_FIELD
#undef GDSKIT_SWITCH_FIELD
#undef GDSKIT_CHOICE_FIELD

constexpr std::size_t k_field_count = sizeof(k_fields) / sizeof(k_fields[0]);

std::size_t index_of(std::string_view name) {
  for (std::size_t i = 0; i < k_field_count; ++i) {
    if (name == k_fields[i].name) return i;
  }
  std::string names;
  for (const auto& f : k_fields) names += names.empty() ? f.name : std::string(", ") + f.name;
  throw error(errno_code(EINVAL), fmt::format("setting \"{}\": no such setting (settings: {})", shown(name), names));
}

// The defaults of this machine: settings{} except the worker count.
settings machine_defaults() {
  settings s;
  // One worker per core reads well from page cache; O_DIRECT on NVMe wants depth, so never fewer than 4.
  unsigned hw = std::thread::hardware_concurrency();
  s.threads = std::clamp(hw == 0 ? 8u : hw, 4u, 16u);
  return s;
}

// The *_set flags follow the sources: a value from the environment or from code wins over profiles.
void mark_set(settings& s, const std::vector<setting_source>& sources) {
  auto given = [&](const char* name) { return sources[index_of(name)] != setting_source::defaults; };
  s.direct_depth_set = given("direct_depth");
  s.chunk_bytes_set = given("chunk_bytes");
  s.staging_slot_bytes_set = given("staging_slot_bytes");
}

// Field `i` from its variable, when the variable is set.
bool read_variable(settings& s, std::size_t i) {
  const char* v = env(k_fields[i].variable);
  if (v == nullptr) return false;
  k_fields[i].parse(s, k_fields[i].variable, v);
  return true;
}

// The process-wide settings and their sources, behind one lock; filled from the environment on first use.
struct global_state {
  std::mutex mutex;
  bool loaded = false;
  settings_state state;

  // Requires the lock.
  settings_state& get() {
    if (!loaded) {
      settings_state fresh{machine_defaults(), std::vector<setting_source>(k_field_count, setting_source::defaults)};
      for (std::size_t i = 0; i < k_field_count; ++i) {
        if (read_variable(fresh.values, i)) fresh.sources[i] = setting_source::environment;
      }
      check_ranges(fresh.values, true);
      mark_set(fresh.values, fresh.sources);
      state = std::move(fresh);
      loaded = true;
    }
    return state;
  }
};

global_state& global() {
  static global_state g;
  return g;
}

}  // namespace

settings settings::from_env() {
  settings s = machine_defaults();
  std::vector<setting_source> sources(k_field_count, setting_source::defaults);
  for (std::size_t i = 0; i < k_field_count; ++i) {
    if (read_variable(s, i)) sources[i] = setting_source::environment;
  }
  check_ranges(s, true);
  mark_set(s, sources);
  return s;
}

void settings::validate() const { check_ranges(*this, false); }

const settings default_settings() {
  auto& g = global();
  std::lock_guard lock(g.mutex);
  return g.get().values;
}

void set_setting(std::string_view name, std::string_view value) {
  const std::size_t i = index_of(name);
  auto& g = global();
  std::lock_guard lock(g.mutex);
  settings_state next = g.get();
  k_fields[i].parse(next.values, name, value);
  check_ranges(next.values, false);
  next.sources[i] = setting_source::code;
  mark_set(next.values, next.sources);
  g.state = std::move(next);
}

void reset_setting(std::string_view name) {
  const std::size_t i = index_of(name);
  auto& g = global();
  std::lock_guard lock(g.mutex);
  settings_state next = g.get();
  const settings defaults = machine_defaults();
  // The field's default, printed and parsed back: one path for every kind of field.
  k_fields[i].parse(next.values, name, k_fields[i].print(defaults));
  next.sources[i] = read_variable(next.values, i) ? setting_source::environment : setting_source::defaults;
  check_ranges(next.values, false);
  mark_set(next.values, next.sources);
  g.state = std::move(next);
}

void set_default_settings(const settings& s) {
  s.validate();
  auto& g = global();
  std::lock_guard lock(g.mutex);
  settings_state next = g.get();
  for (std::size_t i = 0; i < k_field_count; ++i) {
    if (k_fields[i].print(s) != k_fields[i].print(next.values)) next.sources[i] = setting_source::code;
  }
  if (s.direct_depth_set) next.sources[index_of("direct_depth")] = setting_source::code;
  if (s.chunk_bytes_set) next.sources[index_of("chunk_bytes")] = setting_source::code;
  if (s.staging_slot_bytes_set) next.sources[index_of("staging_slot_bytes")] = setting_source::code;
  next.values = s;
  mark_set(next.values, next.sources);
  g.state = std::move(next);
}

std::vector<setting_entry> describe_settings() {
  const settings_state now = save_settings();
  std::vector<setting_entry> out;
  out.reserve(k_field_count);
  for (std::size_t i = 0; i < k_field_count; ++i) {
    const field& f = k_fields[i];
    out.push_back({f.name, f.variable, f.kind, f.print(now.values), now.sources[i], f.help, {}});
    const std::string_view name = f.name;
    const bool shaped = name == "direct_depth" || name == "chunk_bytes" || name == "staging_slot_bytes";
    if (shaped && now.values.adaptive && now.sources[i] == setting_source::defaults) {
      out.back().note = "while transfers run: a device's tuned or learned profile, then the adaptive controller";
    }
  }
  return out;
}

settings_state save_settings() {
  auto& g = global();
  std::lock_guard lock(g.mutex);
  return g.get();
}

void restore_settings(const settings_state& state) {
  if (state.sources.size() != k_field_count) {
    throw error(errno_code(EINVAL), "restore_settings: the state was not made by save_settings()");
  }
  state.values.validate();
  auto& g = global();
  std::lock_guard lock(g.mutex);
  g.state = state;
  g.loaded = true;
}

std::string_view to_string(setting_source s) noexcept {
  switch (s) {
    case setting_source::environment: return "environment";
    case setting_source::code: return "code";
    default: return "default";
  }
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
