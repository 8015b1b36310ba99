#include "engine/route_facts.hpp"

#include <charconv>

namespace gdskit::engine {

std::vector<std::string> p2pdma_missing_outside_kernel(const p2pdma_facts& f) {
  std::vector<std::string> missing;
  if (!f.open_module || f.driver_major < 565) missing.push_back("needs the open driver >= 565");
  if (!f.static_bar1) missing.push_back("NVreg_RegistryDwords lacks RMForceStaticBar1=1");
  if (!f.use_pci_p2pdma) missing.push_back("cufile.json use_pci_p2pdma is false");
  return missing;
}

std::vector<std::string> p2pdma_missing(const p2pdma_facts& f) {
  std::vector<std::string> missing = p2pdma_missing_outside_kernel(f);
  if (f.kernel_known && !f.kernel_p2pdma) {
    missing.insert(missing.begin(), "kernel without PCI P2PDMA (no p2pdma_pgmap_ops)");
  }
  return missing;
}

bool registry_sets_static_bar1(std::string_view registry_dwords) noexcept {
  // Entries are separated by ';' and may carry spaces; the key is case-sensitive in the driver.
  std::size_t pos = 0;
  while (pos <= registry_dwords.size()) {
    auto end = registry_dwords.find(';', pos);
    if (end == std::string_view::npos) end = registry_dwords.size();
    std::string_view e = registry_dwords.substr(pos, end - pos);
    while (!e.empty() && (e.front() == ' ' || e.front() == '"')) e.remove_prefix(1);
    while (!e.empty() && (e.back() == ' ' || e.back() == '"')) e.remove_suffix(1);
    if (e == "RMForceStaticBar1=1" || e == "RMForceStaticBar1=0x1") return true;
    pos = end + 1;
  }
  return false;
}

std::optional<driver_version_token> driver_version_in(std::string_view line) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  auto digits_from = [&](std::size_t i) {
    std::size_t j = i;
    while (j < line.size() && digit(line[j])) ++j;
    return j - i;
  };
  for (std::size_t i = 0; i < line.size();) {
    if (!digit(line[i]) || (i > 0 && digit(line[i - 1]))) {
      ++i;
      continue;
    }
    const std::size_t major_len = digits_from(i);
    std::size_t end = i + major_len;
    if (major_len >= 3 && end < line.size() && line[end] == '.' && digits_from(end + 1) > 0) {
      end += 1 + digits_from(end + 1);
      if (end < line.size() && line[end] == '.' && digits_from(end + 1) > 0) end += 1 + digits_from(end + 1);
      int major = 0;
      auto [p, ec] = std::from_chars(line.data() + i, line.data() + i + major_len, major);
      if (ec != std::errc() || major <= 0) return std::nullopt;
      return driver_version_token{std::string(line.substr(i, end - i)), major};
    }
    i += major_len;
  }
  return std::nullopt;
}

}  // namespace gdskit::engine
