// gdskit patch on synthetic trees: layouts per driver series, hostile trees, round trips, crash before rename.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <sstream>

#include "gdskit/error.hpp"
#include "patch/patch.hpp"
#include "patch/report.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace gdskit::patch;

namespace {

const fs::path fixtures = fs::path(GDSKIT_SOURCE_DIR) / "tests/fixtures/patch";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A writable copy of a fixture tree.
struct tree_copy {
  gdskit::test::temp_dir tmp;
  fs::path root;
  explicit tree_copy(const std::string& name) : root(tmp.path() / name) {
    fs::copy(fixtures / name, root, fs::copy_options::recursive);
  }
  std::string bif() const { return slurp(root / kernel_bif_path); }
  std::string bus() const { return slurp(root / kern_bus_path); }
};

std::size_t count_state(const tree_report& r, edit_state s) {
  std::size_t n = 0;
  for (const auto& e : r.edits) n += e.state == s;
  return n;
}

const edit_report& edit(const tree_report& r, const std::string& id) {
  for (const auto& e : r.edits) {
    if (e.id == id) return e;
  }
  throw std::runtime_error("no edit " + id);
}

}  // namespace

class patch_layouts : public ::testing::TestWithParam<const char*> {};

TEST_P(patch_layouts, RoundTripIsByteIdentical) {
  tree_copy t(GetParam());
  const std::string bif0 = t.bif(), bus0 = t.bus();
  auto before = check_tree(t.root, {});
  ASSERT_FALSE(before.refused) << before.refusal;
  EXPECT_EQ(count_state(before, edit_state::unknown), 0u);
  EXPECT_EQ(count_state(before, edit_state::applied), 0u);

  auto applied = apply_tree(t.root, {});
  ASSERT_FALSE(applied.refused) << applied.refusal;
  EXPECT_NE(t.bif(), bif0);
  EXPECT_NE(t.bus(), bus0);
  EXPECT_EQ(slurp(fs::path(t.root / kernel_bif_path).string() + ".gdskit-orig"), bif0);
  auto after = check_tree(t.root, {});
  EXPECT_EQ(count_state(after, edit_state::original), 0u);
  EXPECT_EQ(count_state(after, edit_state::applied), count_state(before, edit_state::original));

  // Idempotent: a second apply writes nothing.
  const std::string bif1 = t.bif(), bus1 = t.bus();
  auto again = apply_tree(t.root, {});
  ASSERT_FALSE(again.refused);
  EXPECT_EQ(t.bif(), bif1);
  EXPECT_EQ(t.bus(), bus1);

  auto reverted = revert_tree(t.root, {});
  ASSERT_FALSE(reverted.refused) << reverted.refusal;
  EXPECT_EQ(t.bif(), bif0);
  EXPECT_EQ(t.bus(), bus0);
  EXPECT_FALSE(fs::exists(fs::path(t.root / kernel_bif_path).string() + ".gdskit-orig"));
}

TEST_P(patch_layouts, RevertWithoutBackupUsesReverseEdit) {
  tree_copy t(GetParam());
  const std::string bif0 = t.bif(), bus0 = t.bus();
  ASSERT_FALSE(apply_tree(t.root, {}).refused);
  for (auto f : {kernel_bif_path, kern_bus_path}) {
    fs::remove(fs::path(t.root / f).string() + std::string(backup_suffix));
    fs::remove(fs::path(t.root / f).string() + std::string(checksum_suffix));
  }
  auto r = revert_tree(t.root, {});
  ASSERT_FALSE(r.refused) << r.refusal;
  EXPECT_EQ(t.bif(), bif0);
  EXPECT_EQ(t.bus(), bus0);
}

INSTANTIATE_TEST_SUITE_P(all, patch_layouts, ::testing::Values("v550", "v560", "v570", "v580"));

TEST(patch_tree, VersionSpecificChoices) {
  auto r550 = check_tree(fixtures / "v550", {});
  EXPECT_EQ(r550.facts.hal_comment_style, "hal-function");
  EXPECT_EQ(r550.facts.bool_stub_suffix, "bf6dfa");
  EXPECT_EQ(edit(r550, "bif.pcieP2PType").state, edit_state::not_applicable);
  EXPECT_EQ(edit(r550, "bif.forceP2PType").applied, "pKernelBif->forceP2PType = NV_REG_STR_RM_FORCE_P2P_TYPE_BAR1P2P;");
  EXPECT_EQ(edit(r550, "bif.p2pOverride").applied, "pKernelBif->p2pOverride = 0x11;");  // no atomics field

  auto r560 = check_tree(fixtures / "v560", {});
  EXPECT_EQ(r560.facts.hal_comment_style, "halified");
  EXPECT_EQ(edit(r560, "hal.kbusHasPcieBar1P2PMapping").original,
            "pThis->__kbusHasPcieBar1P2PMapping__ = &kbusHasPcieBar1P2PMapping_bf6dfa;");

  auto r570 = check_tree(fixtures / "v570", {});
  EXPECT_EQ(r570.facts.bool_stub_suffix, "d69453");
  EXPECT_EQ(edit(r570, "bif.p2pOverride").applied, "pKernelBif->p2pOverride = 0x211;");
  patch_options off;
  off.atomics = atomics_mode::off;
  EXPECT_EQ(edit(check_tree(fixtures / "v570", off), "bif.p2pOverride").applied, "pKernelBif->p2pOverride = 0x11;");

  auto r580 = check_tree(fixtures / "v580", {});
  EXPECT_EQ(edit(r580, "bif.forceP2PType").applied, "pKernelBif->forceP2PType = NV_REG_STR_RM_FORCE_P2P_TYPE_PCIEP2P;");
  EXPECT_EQ(edit(r580, "bif.pcieP2PType").state, edit_state::original);
  // The assignment in another function is not mistaken for the edit.
  EXPECT_EQ(edit(r580, "bif.p2pOverride").line, 14u);
}

TEST(patch_tree, OnlySelectsOneFile) {
  tree_copy t("v580");
  const std::string bus0 = t.bus();
  patch_options o;
  o.only = edit_group::bif;
  auto r = apply_tree(t.root, o);
  ASSERT_FALSE(r.refused);
  EXPECT_EQ(r.edits.size(), 3u);
  EXPECT_EQ(t.bus(), bus0);
}

TEST(patch_tree, RefusesMissingAndDuplicatedEditsWithoutWriting) {
  for (const char* name : {"missing", "duplicated", "wrong_suffix"}) {
    tree_copy t(name);
    const std::string bif0 = t.bif(), bus0 = t.bus();
    auto r = apply_tree(t.root, {});
    EXPECT_TRUE(r.refused) << name;
    EXPECT_GE(count_state(r, edit_state::unknown), 1u) << name;
    EXPECT_EQ(t.bif(), bif0) << name;
    EXPECT_EQ(t.bus(), bus0) << name;
    EXPECT_FALSE(fs::exists(fs::path(t.root / kernel_bif_path).string() + ".gdskit-orig")) << name;
  }
  auto dup = check_tree(fixtures / "duplicated", {});
  EXPECT_NE(edit(dup, "hal.kbusGetBar1P2PDmaInfo").detail.find("ambiguous"), std::string::npos);
}

TEST(patch_tree, HalfAppliedCompletesAndRevertsToTheRealOriginal) {
  tree_copy t("half_applied");
  tree_copy pristine("v580");
  auto c = check_tree(t.root, {});
  EXPECT_EQ(overall_state(c), "partial");
  EXPECT_EQ(edit(c, "bif.p2pOverride").state, edit_state::applied);  // 0x11 is recognised as applied
  ASSERT_FALSE(apply_tree(t.root, {}).refused);
  EXPECT_EQ(overall_state(check_tree(t.root, {})), "applied");
  // The backup is rebuilt by reverse edit: it equals the untouched tree.
  EXPECT_EQ(slurp(fs::path(t.root / kern_bus_path).string() + ".gdskit-orig"), pristine.bus());
  ASSERT_FALSE(revert_tree(t.root, {}).refused);
  EXPECT_EQ(t.bus(), pristine.bus());
  EXPECT_EQ(t.bif(), pristine.bif());
}

TEST(patch_tree, UnknownVersionNeedsForce) {
  tree_copy t("no_version");
  const std::string bif0 = t.bif();
  auto r = apply_tree(t.root, {});
  EXPECT_TRUE(r.refused);
  EXPECT_EQ(t.bif(), bif0);
  patch_options f;
  f.force = true;
  auto forced = apply_tree(t.root, f);
  EXPECT_FALSE(forced.refused) << forced.refusal;
  EXPECT_NE(t.bif(), bif0);
}

TEST(patch_tree, DiffWritesNothing) {
  tree_copy t("v570");
  const std::string bif0 = t.bif(), bus0 = t.bus();
  auto r = diff_tree(t.root, {});
  EXPECT_NE(r.diff.find("-    pKernelBif->forceP2PType = NV_REG_STR_RM_FORCE_P2P_TYPE_DEFAULT;"), std::string::npos);
  EXPECT_NE(r.diff.find("+        pThis->__kbusHasPcieBar1P2PMapping__ = &kbusHasPcieBar1P2PMapping_GH100;"),
            std::string::npos);
  EXPECT_EQ(t.bif(), bif0);
  EXPECT_EQ(t.bus(), bus0);
  std::size_t entries = 0;
  for (auto it = fs::recursive_directory_iterator(t.root); it != fs::recursive_directory_iterator(); ++it) ++entries;
  std::size_t fixture_entries = 0;
  for (auto it = fs::recursive_directory_iterator(fixtures / "v570"); it != fs::recursive_directory_iterator(); ++it)
    ++fixture_entries;
  EXPECT_EQ(entries, fixture_entries);
}

TEST(patch_tree, CrashBeforeRenameLeavesOriginals) {
  tree_copy t("v580");
  const std::string bif0 = t.bif(), bus0 = t.bus();
  int calls = 0;
  // Fail the rename of the second source file, after the first one was already replaced.
  set_before_rename_hook([&](const fs::path&, const fs::path& target) {
    if (target.filename() == "g_kern_bus_nvoc.c" && calls++ == 0) throw std::runtime_error("simulated crash");
  });
  EXPECT_THROW(apply_tree(t.root, {}), std::runtime_error);
  set_before_rename_hook({});
  EXPECT_EQ(t.bif(), bif0);
  EXPECT_EQ(t.bus(), bus0);
  for (const auto& e : fs::recursive_directory_iterator(t.root)) {
    EXPECT_EQ(e.path().filename().string().find(".gdskit-tmp."), std::string::npos) << e.path();
    EXPECT_EQ(e.path().filename().string().find(".gdskit-orig"), std::string::npos) << e.path();
  }
}

TEST(patch_tree, TamperedBackupRefusesRevert) {
  tree_copy t("v580");
  ASSERT_FALSE(apply_tree(t.root, {}).refused);
  const std::string applied = t.bif();
  std::ofstream(fs::path(t.root / kernel_bif_path).string() + ".gdskit-orig", std::ios::app) << "tampered\n";
  auto r = revert_tree(t.root, {});
  EXPECT_TRUE(r.refused);
  EXPECT_EQ(t.bif(), applied);
}

TEST(patch_tree, WrongSrcIsAClearError) {
  try {
    check_tree("/nonexistent/gdskit/tree", {});
    FAIL();
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code(), gdskit::errno_code(ENOENT));
  }
  gdskit::test::temp_dir empty;
  EXPECT_THROW(check_tree(empty.path(), {}), gdskit::error);
}

TEST(patch_tree, JsonReport) {
  auto j = render_json(check_tree(fixtures / "v580", {}));
  EXPECT_NE(j.find("\"driver_version\": \"580.142\""), std::string::npos);
  EXPECT_NE(j.find("\"original\": 8"), std::string::npos);
}

TEST(patch_tree, Sha256KnownAnswers) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')).size(), 64u);
}

TEST(patch_tree, VersionParsing) {
  EXPECT_EQ(version_from_version_mk("NVIDIA_VERSION = 570.211.01\n")->patch, 1);
  EXPECT_FALSE(version_from_version_mk("NVIDIA_NVID_VERSION = 1.2\n").has_value());
  EXPECT_FALSE(parse_version("580").has_value());
  EXPECT_TRUE(parse_version("580.142").has_value());
}

namespace {

// Every regular file of a tree, by relative path.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), root).string()] = slurp(e.path());
  }
  return files;
}

// Runs `op` with a kill after `k` completed steps (or, when `in_write`, inside the k-th write, after its
// temporary file is written and before its rename). Returns whether the kill happened.
bool killed_at(std::size_t k, bool in_write, const std::function<void()>& op) {
  std::size_t writes = 0;
  if (in_write) {
    set_before_rename_hook([&](const fs::path&, const fs::path&) {
      if (++writes == k) throw simulated_kill{};
    });
  } else {
    set_step_hook([&](std::size_t done) {
      if (done == k) throw simulated_kill{};
    });
  }
  bool killed = false;
  try {
    op();
  } catch (const simulated_kill&) {
    killed = true;
  }
  set_before_rename_hook({});
  set_step_hook({});
  return killed;
}

// After a kill: optionally apply (must end fully applied), then revert (must end byte-identical to the start).
void recover(const fs::path& root, bool apply_first, const std::map<std::string, std::string>& applied,
             const std::map<std::string, std::string>& before) {
  if (apply_first) {
    auto r = apply_tree(root, {});
    ASSERT_FALSE(r.refused) << r.refusal;
    EXPECT_EQ(snapshot(root), applied);
  }
  auto r = revert_tree(root, {});
  ASSERT_FALSE(r.refused) << r.refusal;
  EXPECT_EQ(snapshot(root), before);
}

}  // namespace

TEST(patch_tree, ApplyKilledAtAnyStepRecoversWithApplyOrRevert) {
  for (bool in_write : {false, true}) {
    for (std::size_t k = 1;; ++k) {
      for (bool then_apply : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "kill " << (in_write ? "inside write " : "after step ") << k
                                          << (then_apply ? ", then apply" : ", then revert"));
        tree_copy t("v580");
        const auto before = snapshot(t.root);
        tree_copy ref("v580");
        ASSERT_FALSE(apply_tree(ref.root, {}).refused);
        const auto applied = snapshot(ref.root);
        if (!killed_at(k, in_write, [&] { apply_tree(t.root, {}); })) {
          EXPECT_EQ(snapshot(t.root), applied);  // k is past the last step: apply simply finished
          if (then_apply) goto next_mode;
          continue;
        }
        recover(t.root, then_apply, applied, before);
      }
    }
  next_mode:;
  }
}

TEST(patch_tree, RevertKilledAtAnyStepRecoversWithRevertOrApply) {
  for (bool in_write : {false, true}) {
    for (std::size_t k = 1;; ++k) {
      bool done = false;
      for (bool then_revert : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "kill " << (in_write ? "inside write " : "after step ") << k
                                          << (then_revert ? ", then revert" : ", then apply"));
        tree_copy t("v580");
        const auto before = snapshot(t.root);
        ASSERT_FALSE(apply_tree(t.root, {}).refused);
        const auto applied = snapshot(t.root);
        if (!killed_at(k, in_write, [&] { revert_tree(t.root, {}); })) {
          EXPECT_EQ(snapshot(t.root), before);
          done = true;
          break;
        }
        recover(t.root, !then_revert, applied, before);
      }
      if (done) break;
    }
  }
}

TEST(patch_tree, SymlinkedFolderLeavingTheTreeIsRefused) {
  tree_copy t("v580");
  gdskit::test::temp_dir outside;
  const fs::path bif_dir = (t.root / kernel_bif_path).parent_path();
  fs::rename(bif_dir, outside / "bif");
  fs::create_directory_symlink(outside / "bif", bif_dir);
  const auto outside_before = snapshot(outside.path());
  for (auto op : {&apply_tree, &revert_tree, &check_tree}) {
    try {
      (void)op(t.root, {});
      ADD_FAILURE() << "a link out of the tree must be refused";
    } catch (const gdskit::error& e) {
      EXPECT_EQ(e.code(), std::errc::operation_not_permitted);
    }
  }
  EXPECT_EQ(snapshot(outside.path()), outside_before);
  // A link that stays inside the tree is fine.
  fs::remove(bif_dir);
  fs::rename(outside / "bif", t.root / "bif-real");
  fs::create_directory_symlink(fs::path("../../../../../bif-real"), bif_dir);
  EXPECT_FALSE(apply_tree(t.root, {}).refused);
  EXPECT_FALSE(revert_tree(t.root, {}).refused);
}
