// The GeForce BAR1 P2P driver patch: locate, check, apply, revert and diff the edits to NVIDIA's open GPU kernel
// modules source tree. Edits are found by function and symbol, never by line number. Facts per driver version:
// ../shared/reference/driver-patch.md; user documentation: docs/patch.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gdskit::patch {

/// Relative paths of the files the patch reads or edits, inside a source tree.
inline constexpr std::string_view kernel_bif_path = "src/nvidia/src/kernel/gpu/bif/kernel_bif.c";
inline constexpr std::string_view kern_bus_path = "src/nvidia/generated/g_kern_bus_nvoc.c";
inline constexpr std::string_view registry_header_path = "src/nvidia/interface/nvrm_registry.h";
inline constexpr std::string_view version_mk_path = "version.mk";
/// Suffix of the backup written next to each edited file, and of the checksum file next to the backup.
inline constexpr std::string_view backup_suffix = ".gdskit-orig";
inline constexpr std::string_view checksum_suffix = ".gdskit-orig.sha256";

/// A driver version "580.142" as numbers; major 0 means unknown.
struct driver_version {
  int major = 0;
  int minor = 0;
  int patch = 0;
  std::string text;
  bool known() const noexcept { return major != 0; }
  /// Lexicographic (major, minor, patch) comparison.
  int compare(int maj, int min = 0, int pat = 0) const noexcept;
};

/// Parses "580.142" or "570.211.01"; nullopt when it is not a version.
std::optional<driver_version> parse_version(std::string_view text);
/// Reads NVIDIA_VERSION from the text of version.mk; nullopt when absent.
std::optional<driver_version> version_from_version_mk(std::string_view text);
/// Whether gdskit has been checked against this driver series (550 .. 595).
bool version_supported(const driver_version& v) noexcept;

/// Which group of edits to work on.
enum class edit_group { all, bif, hal };
/// What to write into ForceP2P: `default_atomics` keeps the chipset default for P2P atomics (0x211), `off` forces
/// them off (0x11, the value known to work on GeForce). Before 565 ForceP2P has no atomics field and 0x11 is written either way.
enum class atomics_mode { default_atomics, off };

struct patch_options {
  edit_group only = edit_group::all;
  atomics_mode atomics = atomics_mode::default_atomics;
  /// Accept an unknown or unsupported driver version (layouts are then taken from the files themselves).
  bool force = false;
};

/// State of one edit in the text it was looked for in.
enum class edit_state {
  original,        ///< the unpatched line, found exactly once
  applied,         ///< the patched line, found exactly once
  unknown,         ///< missing, duplicated or unrecognised: the patch refuses to touch the tree
  not_applicable,  ///< this driver version has no such field (pcieP2PType before 575)
};
std::string_view to_string(edit_state s) noexcept;

/// One edit located in a file.
struct edit_report {
  std::string id;        ///< "bif.p2pOverride", "hal.kbusGetBar1P2PDmaInfo", ...
  std::string file;      ///< relative path in the tree
  std::string function;  ///< the C function (BIF) or HAL entry (HAL) it belongs to
  edit_state state = edit_state::unknown;
  std::size_t line = 0;  ///< 1-based line of the located statement, 0 when not located
  std::string found;     ///< the statement as it is now (trimmed), empty when not located
  std::string original;  ///< the unpatched statement (trimmed)
  std::string applied;   ///< the statement apply writes (trimmed)
  std::string detail;    ///< why it is unknown, or a remark on the layout
};

/// What the tree looks like, derived from version.mk, nvrm_registry.h and the files.
struct tree_facts {
  driver_version version;
  bool version_supported = false;
  bool has_pcie_p2p_type = false;     ///< pcieP2PType/RMPcieP2PType exist (575 and later)
  bool has_atomics_field = false;     ///< ForceP2P has an ATOMICS field (565 and later)
  std::string force_p2p_type_value;   ///< NV_REG_STR_RM_FORCE_P2P_TYPE_PCIEP2P (>= 575) or _BAR1P2P (< 575)
  std::string bool_stub_suffix;       ///< "bf6dfa" (<= 560) or "d69453" (>= 565); empty when unknown
  std::string hal_comment_style;      ///< "hal-function" (550), "halified" (555 and later) or "unknown"
  std::vector<std::string> notes;     ///< explanations shown to the user (version-specific choices)
};

/// Texts of the files of a tree; empty optional = file absent.
struct tree_texts {
  std::optional<std::string> version_mk;
  std::optional<std::string> registry_header;
  std::optional<std::string> kernel_bif;
  std::optional<std::string> kern_bus;
};

/// Derives the facts from the texts. Never throws on any input.
tree_facts derive_facts(const tree_texts& texts);
/// Locates every edit of `opts.only` in the texts. Never throws on any input (the fuzz target relies on it).
std::vector<edit_report> locate_edits(const tree_texts& texts, const tree_facts& facts, const patch_options& opts);

/// Result of applying or reverting edits to one file's text.
struct rewrite_result {
  std::string text;
  std::size_t changed_lines = 0;
};
/// Rewrites `text` of file `file` so that every located edit of that file is in the applied (forward) or original
/// (!forward) state. Precondition: no edit of this file is unknown.
rewrite_result rewrite(std::string_view text, std::string_view file, const std::vector<edit_report>& edits,
                       bool forward);

/// A unified diff (3 lines of context) between two texts; empty when they are equal.
std::string unified_diff(std::string_view old_text, std::string_view new_text, std::string_view old_label,
                         std::string_view new_label);

/// Hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

// ---- Whole-tree operations (throw gdskit::error naming the operation and path) -------------------------------

/// The outcome of an operation on a tree.
struct tree_report {
  std::filesystem::path src;
  tree_facts facts;
  std::vector<edit_report> edits;
  /// Per file: "unchanged", "written", "restored from backup", "restored by reverse edit".
  std::vector<std::pair<std::string, std::string>> files;
  /// True when an edit is unknown or the version is refused: nothing was written.
  bool refused = false;
  std::string refusal;
  std::string diff;  ///< filled by diff_tree
};

/// Reads the tree and reports every edit. Throws when `src` is not a driver source tree.
tree_report check_tree(const std::filesystem::path& src, const patch_options& opts);
/// Every file read or written lies inside `src` once symbolic links are resolved; a link that leads out of the
/// tree is refused (gdskit::error EPERM) before anything is written.
/// Applies the edits: all or nothing, idempotent; writes FILE.gdskit-orig.sha256, then FILE.gdskit-orig, then
/// FILE. Each step can be interrupted: a later apply or revert completes or undoes it, and removes temporary
/// files (FILE*.gdskit-tmp.*) an interrupted write left behind.
tree_report apply_tree(const std::filesystem::path& src, const patch_options& opts);
/// Restores the originals byte for byte: from the backup when its checksum holds, else by reverse edit.
tree_report revert_tree(const std::filesystem::path& src, const patch_options& opts);
/// The unified diff apply would write; writes nothing.
tree_report diff_tree(const std::filesystem::path& src, const patch_options& opts);

/// Replaces `target` with `data` atomically: temporary file in the same folder, fsync, rename, fsync of the folder.
/// Keeps the mode of an existing target. Throws gdskit::error; on failure the target is untouched.
void atomic_write(const std::filesystem::path& target, std::string_view data);

/// Test seam: called after the temporary file is written and synced, before the rename. A throwing hook simulates
/// a crash there. Pass {} to remove it.
using before_rename_hook = std::function<void(const std::filesystem::path& tmp, const std::filesystem::path& target)>;
void set_before_rename_hook(before_rename_hook hook);

/// Test seam: thrown by a hook to simulate the process being killed at that point. Unlike any other exception,
/// nothing is cleaned up or rolled back on its way out (a before-rename hook leaves its temporary file).
struct simulated_kill {};
/// Test seam: called by apply_tree and revert_tree after each completed step (one file written, renamed or
/// removed), with the 1-based count of steps done. Throw simulated_kill to stop there. Pass {} to remove it.
using step_hook = std::function<void(std::size_t steps_done)>;
void set_step_hook(step_hook hook);

// ---- NVreg_RegistryDwords and the setup plan -------------------------------------------------------------------

/// The NVreg_RegistryDwords value that sets the three BIF overrides at module load, for this driver version.
struct registry_dwords {
  std::string value;          ///< e.g. "ForceP2P=0x211;RMForceP2PType=1;RMPcieP2PType=1"
  std::string modprobe_conf;  ///< full text of /etc/modprobe.d/gdskit-p2p.conf
  std::vector<std::string> notes;
};
/// Precondition: `v` is known (throws gdskit::error EINVAL otherwise: the value depends on the series, and a
/// guess could select another P2P type). Callers refuse series that version_supported() rejects.
registry_dwords make_registry_dwords(const driver_version& v, atomics_mode atomics);

/// One step of the setup plan.
struct plan_step {
  std::string title;
  std::string why;
  std::string command;   ///< shell text; empty for a manual step
  std::string rollback;  ///< shell text undoing it; empty when nothing to undo
  bool manual = false;   ///< cannot be automated (reboot, BIOS setting)
};

/// Facts of the machine the plan is for (read from a system root so tests can use captured systems).
struct system_facts {
  std::string kernel_release;        ///< uname -r
  std::string loaded_driver_version; ///< /sys/module/nvidia/version, empty when not loaded
  bool open_module = false;          ///< /proc/driver/nvidia/version says "Open Kernel Module"
  std::string nvfs_symbol;           ///< nvme_v1/v2_register_nvfs_dma_ops found in kallsyms, empty when none
  bool nvidia_fs_loaded = false;
  std::string distro_id;             ///< ID= of etc/os-release
};
/// Reads the facts under `root` ("/" for the running system). Never throws.
system_facts read_system_facts(const std::filesystem::path& root);

struct plan_options {
  std::filesystem::path src;  ///< driver source tree (may be empty: a placeholder is used)
  atomics_mode atomics = atomics_mode::default_atomics;
  bool use_registry_dwords = false;  ///< BIF overrides through modprobe options instead of the source edit
};
/// Throws gdskit::error EINVAL when `opts.src` holds control characters (they could break out of the script's
/// comments). Every path in a command is shell-quoted.
std::vector<plan_step> make_setup_plan(const system_facts& sys, const plan_options& opts);
/// The plan as a reviewable shell script, with the rollback plan at the end (commented out).
std::string render_plan(const std::vector<plan_step>& steps, const system_facts& sys);

/// Runs the plan: asks before each step, stops at the first failure. `ask` returns true to run the step; `run`
/// returns the exit status of the shell command. Returns the number of steps that ran successfully.
struct plan_run_result {
  std::size_t steps_done = 0;
  bool failed = false;
  bool stopped_by_user = false;
  std::string failed_step;
  int failed_status = 0;
};
plan_run_result execute_plan(const std::vector<plan_step>& steps,
                             const std::function<bool(const plan_step&)>& ask,
                             const std::function<int(const std::string&)>& run);

/// The honest statement printed by every patch and setup command.
std::string_view honesty_note() noexcept;

}  // namespace gdskit::patch
