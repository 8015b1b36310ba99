#include <charconv>

#include "doctor/checks.hpp"

namespace gdskit::doctor {

std::string_view to_string(status s) noexcept {
  switch (s) {
    case status::ok: return "ok";
    case status::warn: return "warn";
    case status::fail: return "fail";
    case status::unknown: return "unknown";
  }
  return "unknown";
}

std::string_view to_string(verdict_kind v) noexcept {
  switch (v) {
    case verdict_kind::true_gds: return "true_gds";
    case verdict_kind::not_proven: return "not_proven";
    case verdict_kind::compat_only: return "compat_only";
    case verdict_kind::unusable: return "unusable";
  }
  return "unusable";
}

namespace {
int severity(status s) {
  switch (s) {
    case status::ok: return 0;
    case status::warn: return 1;
    case status::unknown: return 2;
    case status::fail: return 3;
  }
  return 2;
}
}  // namespace

status layer::state() const {
  status worst = status::ok;
  for (const auto& c : checks) {
    if (severity(c.state) > severity(worst)) worst = c.state;
  }
  return worst;
}

std::optional<std::pair<std::string, int>> find_field(const std::string& text, const std::string& key,
                                                      const std::string& section) {
  auto lines = split_lines(text);
  bool in_section = section.empty();
  std::size_t section_indent = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    auto indent = l.find_first_not_of(" \t");
    if (indent == std::string::npos) continue;
    auto colon = l.find(':');
    std::string name = trim(l.substr(0, colon == std::string::npos ? l.size() : colon));
    if (!section.empty()) {
      if (name == section && (colon == std::string::npos || trim(l.substr(colon + 1)).empty())) {
        in_section = true;
        section_indent = indent;
        continue;
      }
      if (in_section && indent <= section_indent) in_section = false;
    }
    if (in_section && colon != std::string::npos && name == key) {
      return std::make_pair(trim(l.substr(colon + 1)), static_cast<int>(i + 1));
    }
  }
  return std::nullopt;
}

std::optional<std::uint64_t> parse_u64(const std::string& raw) {
  std::string s = trim(raw);
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s = s.substr(2);
    base = 16;
  }
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

namespace {
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool all_hex(std::string_view s) {
  for (char c : s)
    if (!is_hex(c)) return false;
  return true;
}
}  // namespace

std::optional<version_token> find_version_token(std::string_view line) { return engine::driver_version_in(line); }

bool is_bdf(std::string_view s) noexcept {
  return s.size() == 12 && all_hex(s.substr(0, 4)) && s[4] == ':' && all_hex(s.substr(5, 2)) && s[7] == ':' &&
         all_hex(s.substr(8, 2)) && s[10] == '.' && s[11] >= '0' && s[11] <= '7';
}

std::string last_bdf_in(std::string_view s) {
  for (std::size_t i = s.size(); i-- > 0;) {
    if (i + 12 <= s.size() && is_bdf(s.substr(i, 12))) return std::string(s.substr(i, 12));
  }
  return {};
}

std::string root_complex_in(std::string_view s) {
  // "/pciDDDD:BB/" with hex digits.
  for (std::size_t pos = s.find("/pci"); pos != std::string_view::npos; pos = s.find("/pci", pos + 1)) {
    if (pos + 12 <= s.size() && all_hex(s.substr(pos + 4, 4)) && s[pos + 8] == ':' && all_hex(s.substr(pos + 9, 2)) &&
        s[pos + 11] == '/')
      return std::string(s.substr(pos + 1, 10));
  }
  return {};
}

std::vector<layer> run_checks(system_root& root, const std::string& path) {
  facts f;
  layer userspace{"userspace", "User space (cuFile)", {}};
  // The kernel layer needs the effective cufile.json (P2PDMA route), and every layer may cite the kernel log,
  // libcufile's log or the kernel release; the layers are still reported bottom-up.
  if (auto rel = root.read("proc/sys/kernel/osrelease", 4096); rel.ok()) f.release = trim(*rel.text);
  if (auto dmesg = root.command("dmesg"); dmesg.ok()) {
    f.dmesg_readable = true;
    f.dmesg = std::move(*dmesg.text);
  }
  if (auto log = root.command("cufile-log"); log.ok()) {
    f.cufile_log_readable = true;
    f.cufile_log = std::move(*log.text);
  }
  read_cufile_config(root, f, userspace);
  std::vector<layer> layers;
  layers.push_back(check_gpu(root, f));
  layers.push_back(check_kernel(root, f));
  check_userspace(root, f, userspace);
  layers.push_back(std::move(userspace));
  layers.push_back(check_storage(root, f, path));
  layers.push_back(check_logs(root, f));
  return layers;
}

}  // namespace gdskit::doctor
