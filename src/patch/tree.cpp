// check / apply / revert / diff on a driver source tree. Every operation reads all files, decides everything in
// memory, and only then writes: a refusal or a failed write leaves the tree as it was.
#include <algorithm>
#include <cerrno>
#include <mutex>

#include <unistd.h>

#include <fmt/format.h>

#include "posix/bounded_read.hpp"
#include "gdskit/error.hpp"
#include "patch/patch.hpp"

namespace gdskit::patch {
namespace fs = std::filesystem;
namespace {

// Driver source files are a few MiB at most; anything larger, or anything that is not a regular file (a FIFO
// would block, a device never end), is refused rather than read.
constexpr std::size_t max_source_bytes = 64u << 20;

std::optional<std::string> read_optional(const fs::path& p) {
  auto r = read_bounded(p, max_source_bytes);
  if (!r.ok()) {
    if (r.error == std::errc::no_such_file_or_directory) return std::nullopt;
    throw error(r.error, "read", p.string(), -1, 0, r.why);
  }
  if (r.capped) {
    throw error(errno_code(EFBIG), "read", p.string(), -1, 0,
                fmt::format("larger than {} MiB: not a driver source file", max_source_bytes >> 20));
  }
  return std::move(r.text);
}

std::mutex step_hook_mutex;
step_hook& the_step_hook() {
  static step_hook h;
  return h;
}

void step_done(std::size_t n) {
  step_hook h;
  {
    std::lock_guard lock(step_hook_mutex);
    h = the_step_hook();
  }
  if (h) h(n);
}

// `src / rel` with every symbolic link resolved must stay inside `src`: a linked folder or file that leads out
// of the tree would make apply write (or revert restore) somewhere the user never named.
fs::path inside_tree(const fs::path& src, const fs::path& rel) {
  std::error_code ec;
  const fs::path root = fs::canonical(src, ec);
  if (ec) throw error(ec, "patch: resolve source tree", src.string(), -1, 0);
  const fs::path full = src / rel;
  const fs::path real = fs::weakly_canonical(full, ec);
  if (ec) throw error(ec, "patch: resolve", full.string(), -1, 0);
  auto r = real.begin();
  for (auto it = root.begin(); it != root.end(); ++it, ++r) {
    if (r == real.end() || *r != *it) {
      throw error(errno_code(EPERM), "patch: resolve", full.string(), -1, 0,
                  fmt::format("a symbolic link leads out of the source tree (to {}); refusing to read or write there",
                              real.string()));
    }
  }
  return full;
}

tree_texts read_tree(const fs::path& src) {
  std::error_code ec;
  if (!fs::exists(src, ec)) {
    throw error(errno_code(ENOENT), "patch: open source tree", src.string(), -1, 0,
                "no such folder; --src takes a checkout of NVIDIA/open-gpu-kernel-modules");
  }
  if (!fs::is_directory(src, ec)) {
    throw error(errno_code(ENOTDIR), "patch: open source tree", src.string(), -1, 0,
                "not a folder; --src takes a checkout of NVIDIA/open-gpu-kernel-modules");
  }
  tree_texts t;
  t.version_mk = read_optional(inside_tree(src, version_mk_path));
  t.registry_header = read_optional(inside_tree(src, registry_header_path));
  t.kernel_bif = read_optional(inside_tree(src, kernel_bif_path));
  t.kern_bus = read_optional(inside_tree(src, kern_bus_path));
  if (!t.kernel_bif && !t.kern_bus) {
    throw error(errno_code(ENOENT), "patch: open source tree", src.string(), -1, 0,
                fmt::format("neither {} nor {} exists: this is not a checkout of NVIDIA/open-gpu-kernel-modules "
                            "(give the folder that holds version.mk and src/nvidia)",
                            kernel_bif_path, kern_bus_path));
  }
  return t;
}

std::vector<std::string> selected_files(edit_group g) {
  std::vector<std::string> out;
  if (g != edit_group::hal) out.emplace_back(kernel_bif_path);
  if (g != edit_group::bif) out.emplace_back(kern_bus_path);
  return out;
}

const std::optional<std::string>& text_of(const tree_texts& t, std::string_view file) {
  return file == kernel_bif_path ? t.kernel_bif : t.kern_bus;
}

tree_report analyse(const fs::path& src, const patch_options& opts, tree_texts& texts) {
  texts = read_tree(src);
  tree_report r;
  r.src = src;
  r.facts = derive_facts(texts);
  r.edits = locate_edits(texts, r.facts, opts);
  if (!r.facts.version.known()) {
    r.facts.notes.push_back(fmt::format("no NVIDIA_VERSION in {}: driver version unknown", version_mk_path));
  }
  if (!r.facts.version_supported && !opts.force) {
    r.refused = true;
    r.refusal = r.facts.version.known()
                    ? fmt::format("driver {} is not a series gdskit knows (550 to 595); --force patches it anyway",
                                  r.facts.version.text)
                    : "driver version unknown; --force patches it anyway";
  } else if (!r.facts.version_supported) {
    r.facts.notes.push_back(
        "--force: this driver series was never checked; the edits are taken from the files as found, the enum "
        "names from nvrm_registry.h. A wrong enum can fail the build or, worse, build a module that picks a "
        "different P2P type (before 575, RMForceP2PType 2 meant BAR1P2P; from 575 it means NVLINK).");
  }
  std::vector<std::string> bad;
  for (const auto& e : r.edits) {
    if (e.state == edit_state::unknown) bad.push_back(fmt::format("{} ({})", e.id, e.detail));
  }
  if (!bad.empty()) {
    r.refused = true;
    const std::string msg =
        fmt::format("{} edit(s) cannot be located unambiguously: {}", bad.size(), fmt::join(bad, "; "));
    r.refusal = r.refusal.empty() ? msg : r.refusal + "; " + msg;
  }
  return r;
}

fs::path backup_of(const fs::path& file) { return fs::path(file.string() + std::string(backup_suffix)); }
fs::path checksum_of(const fs::path& file) { return fs::path(file.string() + std::string(checksum_suffix)); }

std::string checksum_line(std::string_view data, const fs::path& backup) {
  return fmt::format("{}  {}\n", sha256_hex(data), backup.filename().string());
}

// The backup is trusted only when its checksum file names the same digest.
bool backup_verified(const std::string& backup, const std::optional<std::string>& sum) {
  if (!sum) return false;
  const std::string digest = sha256_hex(backup);
  return sum->size() >= digest.size() && sum->compare(0, digest.size(), digest) == 0;
}

struct pending_write {
  fs::path path;
  std::optional<std::string> old_text;  // nullopt: the file did not exist (remove it on rollback)
  std::optional<std::string> new_text;  // nullopt: remove the file
};

void remove_file(const fs::path& p) {
  if (::unlink(p.c_str()) != 0 && errno != ENOENT) throw error(errno_code(errno), "remove", p.string(), -1, 0);
}

// Runs the writes in order; if one fails, the ones already done are undone (best effort) and the error rethrown.
void commit(const std::vector<pending_write>& writes) {
  std::size_t done = 0;
  try {
    for (; done < writes.size(); ++done) {
      const auto& w = writes[done];
      if (w.new_text) {
        atomic_write(w.path, *w.new_text);
      } else {
        remove_file(w.path);
      }
      step_done(done + 1);
    }
  } catch (const simulated_kill&) {
    throw;
  } catch (...) {
    for (std::size_t i = done; i-- > 0;) {
      const auto& w = writes[i];
      try {
        if (w.old_text) {
          atomic_write(w.path, *w.old_text);
        } else {
          remove_file(w.path);
        }
      } catch (...) {
        // Keep unwinding: the first error is the one the caller needs.
      }
    }
    throw;
  }
}

// An interrupted atomic_write leaves NAME.gdskit-tmp.XXXXXXXX beside NAME; only such names of the files the
// patch writes are removed.
void remove_stale_temporaries(const fs::path& src, const std::vector<std::string>& files) {
  for (const auto& file : files) {
    const fs::path path = inside_tree(src, file);
    std::vector<std::string> prefixes;
    for (const fs::path& p : {path, backup_of(path), checksum_of(path)})
      prefixes.push_back(p.filename().string() + ".gdskit-tmp.");
    std::error_code ec;
    for (fs::directory_iterator it(path.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      for (const auto& prefix : prefixes) {
        if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) {
          remove_file(it->path());
          break;
        }
      }
    }
  }
}

}  // namespace

void set_step_hook(step_hook hook) {
  std::lock_guard lock(step_hook_mutex);
  the_step_hook() = std::move(hook);
}

tree_report check_tree(const fs::path& src, const patch_options& opts) {
  tree_texts texts;
  return analyse(src, opts, texts);
}

tree_report diff_tree(const fs::path& src, const patch_options& opts) {
  tree_texts texts;
  tree_report r = analyse(src, opts, texts);
  if (r.refused) return r;
  for (const auto& file : selected_files(opts.only)) {
    const auto& text = text_of(texts, file);
    if (!text) continue;
    const auto res = rewrite(*text, file, r.edits, true);
    r.diff += unified_diff(*text, res.text, "a/" + file, "b/" + file);
  }
  return r;
}

tree_report apply_tree(const fs::path& src, const patch_options& opts) {
  tree_texts texts;
  tree_report r = analyse(src, opts, texts);
  if (r.refused) return r;
  remove_stale_temporaries(src, selected_files(opts.only));
  std::vector<pending_write> writes;
  for (const auto& file : selected_files(opts.only)) {
    const auto& text = text_of(texts, file);
    const fs::path path = inside_tree(src, file);
    if (!text) continue;
    inside_tree(src, backup_of(file).string());
    inside_tree(src, checksum_of(file).string());
    const auto fwd = rewrite(*text, file, r.edits, true);
    if (fwd.text == *text) {
      r.files.emplace_back(file, "unchanged (already applied)");
      continue;
    }
    const bool all_original_known = std::all_of(r.edits.begin(), r.edits.end(), [&](const edit_report& e) {
      return e.file != file || e.state != edit_state::applied || !e.original.empty();
    });
    const fs::path backup = backup_of(path);
    const auto old_backup = read_optional(backup);
    const std::string original = rewrite(*text, file, r.edits, false).text;
    if (old_backup) {
      const auto sum = read_optional(checksum_of(path));
      if (!backup_verified(*old_backup, sum) || (all_original_known && *old_backup != original)) {
        r.refused = true;
        r.refusal = fmt::format(
            "{} exists but is not the original of {} (checksum or content differs); move it away and retry",
            backup.string(), file);
        return r;
      }
    } else {
      if (!all_original_known) {
        r.refused = true;
        r.refusal = fmt::format("{} is partly patched, has no backup and its original cannot be rebuilt", file);
        return r;
      }
      // The checksum goes first: a checksum without its backup is harmless (rewritten here, removed by revert),
      // while a backup without its checksum would be distrusted by both apply and revert.
      writes.push_back({checksum_of(path), read_optional(checksum_of(path)), checksum_line(original, backup)});
      writes.push_back({backup, std::nullopt, original});
    }
    writes.push_back({path, *text, fwd.text});
    r.files.emplace_back(file, fmt::format("written ({} line(s) changed; backup {})", fwd.changed_lines,
                                           backup.filename().string()));
  }
  commit(writes);
  return r;
}

tree_report revert_tree(const fs::path& src, const patch_options& opts) {
  tree_texts texts = read_tree(src);
  remove_stale_temporaries(src, selected_files(opts.only));
  tree_report r;
  r.src = src;
  r.facts = derive_facts(texts);
  r.edits = locate_edits(texts, r.facts, opts);
  std::vector<pending_write> writes;
  std::vector<std::string> problems;
  for (const auto& file : selected_files(opts.only)) {
    const auto& text = text_of(texts, file);
    const fs::path path = inside_tree(src, file);
    if (!text) continue;
    const fs::path backup = inside_tree(src, backup_of(file).string());
    inside_tree(src, checksum_of(file).string());
    const auto bak = read_optional(backup);
    const auto sum = read_optional(checksum_of(path));
    const bool located = std::all_of(r.edits.begin(), r.edits.end(), [&](const edit_report& e) {
      return e.file != file || e.state == edit_state::original || e.state == edit_state::not_applicable ||
             (e.state == edit_state::applied && !e.original.empty());
    });
    const std::optional<std::string> reversed =
        located ? std::optional<std::string>(rewrite(*text, file, r.edits, false).text) : std::nullopt;
    if (bak) {
      if (!backup_verified(*bak, sum)) {
        problems.push_back(fmt::format("{}: checksum of {} does not match {}", file, backup.filename().string(),
                                       checksum_of(path).filename().string()));
        continue;
      }
      if (reversed && *reversed != *bak && !opts.force) {
        problems.push_back(fmt::format(
            "{} was changed beyond the patch since apply; --force restores {} anyway (and loses those changes)",
            file, backup.filename().string()));
        continue;
      }
      if (!reversed && !opts.force) {
        problems.push_back(fmt::format("{}: the patched lines are not where apply left them; --force restores {}",
                                       file, backup.filename().string()));
        continue;
      }
      if (*bak != *text) writes.push_back({path, *text, *bak});
      writes.push_back({backup, *bak, std::nullopt});
      writes.push_back({checksum_of(path), sum, std::nullopt});
      r.files.emplace_back(file, "restored from backup (sha256 verified)");
    } else if (reversed) {
      if (*reversed == *text) {
        r.files.emplace_back(file, "unchanged (already original)");
      } else {
        writes.push_back({path, *text, *reversed});
        r.files.emplace_back(file, "restored by reverse edit (no backup)");
      }
      // A checksum without its backup is what an apply or revert stopped half-way leaves.
      if (sum) writes.push_back({checksum_of(path), sum, std::nullopt});
    } else {
      std::vector<std::string> bad;
      for (const auto& e : r.edits) {
        if (e.file == file && (e.state == edit_state::unknown || e.original.empty())) bad.push_back(e.id);
      }
      problems.push_back(fmt::format("{} has no backup and edits {} cannot be reversed", file, fmt::join(bad, ", ")));
    }
  }
  if (!problems.empty()) {
    r.refused = true;
    r.refusal = fmt::format("{}", fmt::join(problems, "; "));
    r.files.clear();
    return r;
  }
  commit(writes);
  // Report the states as they are now.
  tree_texts after = read_tree(src);
  r.edits = locate_edits(after, r.facts, opts);
  return r;
}

}  // namespace gdskit::patch
