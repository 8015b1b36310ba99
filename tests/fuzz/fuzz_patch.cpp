// Fuzz target for the patch input parser: any bytes as kernel_bif.c, g_kern_bus_nvoc.c, version.mk and
// nvrm_registry.h must locate, rewrite and diff without crashing, and apply-then-revert must give the input back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "patch/patch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gdskit::patch;
  const std::string all(reinterpret_cast<const char*>(data), size);
  // Split the input into four texts at form feeds so the corpus can hold whole trees.
  std::string parts[4];
  std::size_t k = 0;
  for (char c : all) {
    if (c == '\f' && k < 3) {
      ++k;
    } else {
      parts[k] += c;
    }
  }
  tree_texts t;
  t.kernel_bif = parts[0];
  t.kern_bus = parts[1];
  if (!parts[2].empty()) t.version_mk = parts[2];
  if (!parts[3].empty()) t.registry_header = parts[3];
  const tree_facts facts = derive_facts(t);
  for (auto atomics : {atomics_mode::default_atomics, atomics_mode::off}) {
    patch_options o;
    o.atomics = atomics;
    const auto edits = locate_edits(t, facts, o);
    bool all_known = true;
    for (const auto& e : edits) all_known &= e.state != edit_state::unknown && (e.state != edit_state::applied || !e.original.empty());
    for (auto file : {kernel_bif_path, kern_bus_path}) {
      const std::string& text = file == kernel_bif_path ? parts[0] : parts[1];
      const auto fwd = rewrite(text, file, edits, true);
      (void)unified_diff(text, fwd.text, "a", "b");
      if (all_known) {
        // Reverting the applied text must give the original state of every edit back.
        tree_texts t2 = t;
        (file == kernel_bif_path ? t2.kernel_bif : t2.kern_bus) = fwd.text;
        const auto edits2 = locate_edits(t2, facts, o);
        const auto back = rewrite(fwd.text, file, edits2, false);
        const auto orig_back = rewrite(text, file, edits, false);
        if (back.text != orig_back.text) std::abort();
      }
    }
  }
  (void)sha256_hex(all);
  (void)parse_version(parts[2]);
  return 0;
}
