// gdskit patch registry-dwords and gdskit setup plan on captured system roots.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "gdskit/error.hpp"
#include "patch/patch.hpp"
#include "test_support.hpp"

using namespace gdskit::patch;
namespace fs = std::filesystem;

TEST(patch_setup, RegistryDwordsPerVersion) {
  EXPECT_EQ(make_registry_dwords(*parse_version("580.142"), atomics_mode::default_atomics).value,
            "ForceP2P=0x211;RMForceP2PType=1;RMPcieP2PType=1");
  EXPECT_EQ(make_registry_dwords(*parse_version("580.142"), atomics_mode::off).value,
            "ForceP2P=0x11;RMForceP2PType=1;RMPcieP2PType=1");
  EXPECT_EQ(make_registry_dwords(*parse_version("570.211.01"), atomics_mode::default_atomics).value,
            "ForceP2P=0x211;RMForceP2PType=2");
  EXPECT_EQ(make_registry_dwords(*parse_version("550.163.01"), atomics_mode::default_atomics).value,
            "ForceP2P=0x11;RMForceP2PType=2");
  auto r = make_registry_dwords(*parse_version("580.142"), atomics_mode::default_atomics);
  EXPECT_NE(r.modprobe_conf.find("options nvidia NVreg_RegistryDwords=\"ForceP2P=0x211;"), std::string::npos);
}

TEST(patch_setup, PlanForCapturedSystem) {
  gdskit::test::temp_dir root;
  fs::create_directories(root.path() / "proc/sys/kernel");
  fs::create_directories(root.path() / "sys/module/nvidia");
  fs::create_directories(root.path() / "etc");
  std::ofstream(root.path() / "proc/sys/kernel/osrelease") << "6.8.0-1020-nvidia\n";
  std::ofstream(root.path() / "sys/module/nvidia/version") << "580.142\n";
  std::ofstream(root.path() / "etc/os-release") << "NAME=\"Ubuntu\"\nID=ubuntu\n";
  std::ofstream(root.path() / "proc/kallsyms") << "0000000000000000 T nvme_v1_register_nvfs_dma_ops\t[nvme]\n";
  auto sys = read_system_facts(root.path());
  EXPECT_EQ(sys.kernel_release, "6.8.0-1020-nvidia");
  EXPECT_EQ(sys.nvfs_symbol, "nvme_v1_register_nvfs_dma_ops");
  plan_options o;
  o.src = "/opt/ogkm";
  auto steps = make_setup_plan(sys, o);
  auto text = render_plan(steps, sys);
  EXPECT_NE(text.find("gdskit patch apply --src '/opt/ogkm'"), std::string::npos);
  EXPECT_NE(text.find("update-initramfs"), std::string::npos);
  EXPECT_NE(text.find("Rollback plan"), std::string::npos);
  EXPECT_NE(text.find("gdskit doctor"), std::string::npos);
  EXPECT_EQ(text.find("Install a kernel"), std::string::npos);  // the hook is there

  std::ofstream(root.path() / "proc/kallsyms") << "0000000000000000 T nvme_setup_cmd\t[nvme]\n";
  auto no_hook = read_system_facts(root.path());
  EXPECT_TRUE(no_hook.nvfs_symbol.empty());
  EXPECT_NE(render_plan(make_setup_plan(no_hook, o), no_hook).find("Install a kernel"), std::string::npos);
}

TEST(patch_setup, CapturedRootLinksThatLeaveItAreNotFollowed) {
  const std::string marker = "MARKER-OUTSIDE-THE-ROOT";
  gdskit::test::temp_dir t;
  const fs::path root = t.path() / "root";
  fs::create_directories(root / "proc/sys/kernel");
  fs::create_directories(root / "sys/module/nvidia");
  gdskit::test::write_text(t.path() / "outside/release", marker + "\n");
  gdskit::test::write_text(t.path() / "outside/kallsyms", "0000000000000000 T nvme_v1_register_nvfs_dma_ops\t[nvme]\n");
  fs::create_directories(t.path() / "outside/nvidia_fs");
  fs::create_symlink(t.path() / "outside/release", root / "proc/sys/kernel/osrelease");
  fs::create_symlink("../../../../outside/release", root / "sys/module/nvidia/version");
  fs::create_symlink("../../outside/kallsyms", root / "proc/kallsyms");
  fs::create_directory_symlink("../../../outside/nvidia_fs", root / "sys/module/nvidia_fs");
  const auto sys = read_system_facts(root);
  EXPECT_EQ(sys.kernel_release, "");
  EXPECT_EQ(sys.loaded_driver_version, "");
  EXPECT_EQ(sys.nvfs_symbol, "");
  EXPECT_FALSE(sys.nvidia_fs_loaded);
  plan_options o;
  o.src = "/opt/ogkm";
  EXPECT_EQ(render_plan(make_setup_plan(sys, o), sys).find(marker), std::string::npos);
}

TEST(patch_setup, ExecuteAsksAndStopsAtFirstFailure) {
  std::vector<plan_step> steps{{"a", "", "true", "", false}, {"b", "", "false", "", false},
                               {"c", "", "true", "", false}};
  std::vector<std::string> ran;
  auto r = execute_plan(
      steps, [](const plan_step&) { return true; },
      [&](const std::string& c) {
        ran.push_back(c);
        return c == "false" ? 1 : 0;
      });
  EXPECT_TRUE(r.failed);
  EXPECT_EQ(r.failed_step, "b");
  EXPECT_EQ(r.steps_done, 1u);
  EXPECT_EQ(ran.size(), 2u);

  ran.clear();
  auto no = execute_plan(steps, [](const plan_step&) { return false; }, [&](const std::string& c) {
    ran.push_back(c);
    return 0;
  });
  EXPECT_TRUE(no.stopped_by_user);
  EXPECT_TRUE(ran.empty());
}

TEST(patch_setup, RegistryDwordsNeedAKnownVersion) {
  try {
    (void)make_registry_dwords(driver_version{}, atomics_mode::default_atomics);
    FAIL() << "an unknown version must not get a value";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
  }
  auto r = make_registry_dwords(*parse_version("580.142"), atomics_mode::default_atomics);
  for (std::size_t pos = 0; pos < r.modprobe_conf.size();) {
    auto nl = r.modprobe_conf.find('\n', pos);
    std::string line = r.modprobe_conf.substr(pos, nl - pos);
    EXPECT_TRUE(line.empty() || line[0] == '#' || line.rfind("options nvidia NVreg_RegistryDwords=\"", 0) == 0) << line;
    pos = nl + 1;
  }
}

TEST(patch_setup, PlanRefusesControlCharactersAndQuotesPaths) {
  system_facts sys;
  sys.loaded_driver_version = "580.142";
  plan_options o;
  o.src = "/x\ntouch /tmp/PWNED";
  try {
    (void)make_setup_plan(sys, o);
    FAIL() << "a newline in --src must be refused";
  } catch (const gdskit::error& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
    EXPECT_EQ(e.path(), o.src.string()) << "the path as given: the message escapes it, once";
  }
  o.src = "/opt/it's $(reboot)";
  o.use_registry_dwords = true;
  const auto text = render_plan(make_setup_plan(sys, o), sys);
  EXPECT_NE(text.find("--src '/opt/it'\\''s $(reboot)'"), std::string::npos) << text;
  const auto rollback = text.substr(text.find("# === Rollback plan"));
  for (std::size_t pos = 0; pos < rollback.size();) {
    auto nl = rollback.find('\n', pos);
    EXPECT_EQ(rollback[pos], '#') << rollback.substr(pos, nl - pos);
    pos = nl + 1;
  }
  // A loaded driver that gdskit does not know gets no guessed value: the step is manual.
  sys.loaded_driver_version = "535.183.01";
  const auto steps = make_setup_plan(sys, o);
  auto it = std::find_if(steps.begin(), steps.end(),
                         [](const plan_step& s) { return s.title == "Set the BIF overrides as module options"; });
  ASSERT_NE(it, steps.end());
  EXPECT_TRUE(it->manual);
  EXPECT_NE(it->why.find("535.183.01"), std::string::npos);
}
