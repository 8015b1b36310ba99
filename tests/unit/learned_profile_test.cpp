// Learned profiles: the shape the controller converged to is remembered in the profile folder and the next
// process holds it from its first transfer; bad files are ignored with a reason; GDSKIT_LEARN=off neither reads
// nor writes them. (Each test runs in its own process, so the per-process caches start empty.)
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "doctor/checks.hpp"
#include "doctor/system_root.hpp"
#include "engine/device_profile.hpp"
#include "engine/io_schedule.hpp"
#include "test_support.hpp"

namespace gdskit::engine {
namespace {

using test::temp_dir;
namespace fs = std::filesystem;
constexpr std::size_t kMiB = std::size_t{1} << 20;

learned_profile sample(const device_identity& id) {
  learned_profile p;
  p.device = id;
  p.shapes["staged-read"] = {{4, 2 * kMiB}, 3.5, "2026-12-01T09:00:00Z"};
  p.shapes["host-write"] = {{8, 8 * kMiB}, 1.25, "2026-12-01T09:00:01Z"};
  return p;
}

TEST(learned_profile, saved_shapes_load_back_beside_the_tuned_profile) {
  temp_dir t;
  const device_identity id{"nvme0n1", "wwid=eui.1234"};
  const fs::path dir = t.path() / "cache/gdskit";
  const fs::path file = save_learned(dir, sample(id));
  EXPECT_EQ(file, learned_path(dir, id));
  EXPECT_EQ(file.parent_path(), profile_path(dir, id).parent_path());
  EXPECT_NE(file, profile_path(dir, id));
  const auto r = load_learned(file, id);
  ASSERT_TRUE(r.learned) << r.reason;
  ASSERT_EQ(r.learned->shapes.size(), 2u);
  EXPECT_EQ(r.learned->shapes.at("staged-read").shape, (io_shape{4, 2 * kMiB}));
  EXPECT_DOUBLE_EQ(r.learned->shapes.at("host-write").gib_per_s, 1.25);
  EXPECT_EQ(r.learned->shapes.at("host-write").updated, "2026-12-01T09:00:01Z");
  EXPECT_EQ(learned_key(io_dir::read, true), "staged-read");
  EXPECT_EQ(learned_key(io_dir::write, false), "host-write");
}

TEST(learned_profile, bad_files_are_ignored_with_a_reason_and_foreign_text_is_dropped) {
  temp_dir t;
  const device_identity id{"nvme0n1", "wwid=eui.1234"};
  const nlohmann::json good = nlohmann::json::parse(learned_json(sample(id)));
  auto edit = [&](auto f) {
    nlohmann::json j = good;
    f(j);
    return j.dump();
  };
  const std::vector<std::pair<const char*, std::string>> bad = {
      {"unparsable", "{\"version\": 1, \"shapes\": "},
      {"wrong version", edit([](auto& j) { j["version"] = 7; })},
      // Version 1 held request sizes that could have won on a tie: set aside, learned again.
      {"version 1", edit([](auto& j) { j["version"] = 1; })},
      {"another device", edit([](auto& j) { j["device"]["key"] = "wwid=other"; })},
      {"no shapes", edit([](auto& j) { j.erase("shapes"); })},
      {"shapes not an object", edit([](auto& j) { j["shapes"] = "x"; })},
      {"depth zero", edit([](auto& j) { j["shapes"]["staged-read"]["depth"] = 0; })},
      {"request not aligned", edit([](auto& j) { j["shapes"]["host-write"]["request_bytes"] = 12345; })},
      {"rate missing", edit([](auto& j) { j["shapes"]["staged-read"].erase("gib_per_s"); })},
      {"rate absurd", edit([](auto& j) { j["shapes"]["staged-read"]["gib_per_s"] = 1e9; })},
      {"too large", good.dump() + std::string(k_profile_max_bytes, ' ')},
  };
  for (const auto& [what, text] : bad) {
    SCOPED_TRACE(what);
    test::write_text(t.path() / "l.json", text);
    const auto r = load_learned(t.path() / "l.json", id);
    EXPECT_FALSE(r.learned);
    EXPECT_NE(r.reason.find("learned profile"), std::string::npos) << r.reason;
  }
  fs::create_symlink(t.path() / "l.json", t.path() / "link.json");
  EXPECT_FALSE(load_learned(t.path() / "link.json", id).learned);
  EXPECT_EQ(load_learned(t.path() / "missing.json", id).reason, "nothing learned yet");

  // Unknown keys are dropped; a timestamp with control characters is not kept (doctor prints it).
  test::write_text(t.path() / "odd.json", edit([](auto& j) {
        j["shapes"]["rm -rf"] = j["shapes"]["staged-read"];
        j["shapes"]["staged-read"]["updated"] = "2026\x1b[31m";
      }));
  const auto r = load_learned(t.path() / "odd.json", id);
  ASSERT_TRUE(r.learned) << r.reason;
  EXPECT_EQ(r.learned->shapes.size(), 2u);
  EXPECT_EQ(r.learned->shapes.at("staged-read").updated, "");
}

// The folder of a real file in a private cache folder, so the test writes nothing into the user's cache.
struct cache_env {
  temp_dir t{test::direct_capable_parent()};
  dev_t dev = 0;
  cache_env() {
    ::setenv("XDG_CACHE_HOME", (t.path() / "cache").c_str(), 1);
    struct stat st {};
    EXPECT_EQ(::stat(t.path().c_str(), &st), 0);
    dev = st.st_dev;
  }
  fs::path learned_file() const { return learned_path(t.path() / "cache/gdskit", identify_device("/", dev)); }
  // A learned profile of this device with one shape, as an earlier process would have left it.
  void learn(const std::string& key, const learned_shape& shape) const {
    learned_profile p;
    p.device = identify_device("/", dev);
    p.shapes[key] = shape;
    save_learned(t.path() / "cache/gdskit", p);
  }
};

TEST(learned_profile, the_next_process_holds_the_learned_shape_from_its_first_transfer) {
  cache_env env;
  env.learn("staged-read", {{4, 2 * kMiB}, 3.0, "2026-12-01T09:00:00Z"});
  settings cfg;
  scheduled_transfer s(cfg, env.dev, io_dir::read, io_client::staged, std::size_t{1} << 30);
  EXPECT_EQ(s.shape(), (io_shape{4, 2 * kMiB}));
  const std::string why = schedule_reason(cfg, env.dev, io_dir::read, io_client::staged);
  EXPECT_NE(why.find("learned profile"), std::string::npos) << why;
  EXPECT_NE(why.find("holding the learned shape"), std::string::npos) << why;
  // Writes on the same device were not learned: they start from the default.
  const std::string w = schedule_reason(cfg, env.dev, io_dir::write, io_client::staged);
  EXPECT_EQ(w.find("learned profile"), std::string::npos) << w;
}

TEST(learned_profile, off_means_neither_read_nor_written) {
  cache_env env;
  env.learn("host-read", {{8, 2 * kMiB}, 3.0, ""});
  settings cfg;
  cfg.learn = false;
  scheduled_transfer s(cfg, env.dev, io_dir::read, io_client::host, std::size_t{1} << 30);
  EXPECT_EQ(s.shape(), k_start_shape);
  EXPECT_EQ(schedule_reason(cfg, env.dev, io_dir::read, io_client::host).find("learned"), std::string::npos);
}

// Feeds a probing transfer windows of equal rate until its controller converges; the transfer ends with it.
void converge(scheduled_transfer& s, const settings& cfg, dev_t dev, io_dir dir) {
  s.start(std::size_t{1} << 40);
  for (int i = 0; i < 400; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(12));  // each window lasts its minimum time
    s.complete(std::size_t{4} << 30, s.shape().request_bytes);
    if (schedule_reason(cfg, dev, dir, io_client::host).find("converged") != std::string::npos) return;
  }
}

TEST(learned_profile, a_converged_shape_is_remembered_once_and_only_when_learning_is_on) {
  cache_env env;
  settings off;
  off.learn = false;
  {
    scheduled_transfer s(off, env.dev, io_dir::write, io_client::host, std::size_t{1} << 40);
    converge(s, off, env.dev, io_dir::write);
  }
  EXPECT_FALSE(fs::exists(env.learned_file())) << "GDSKIT_LEARN=off wrote a learned profile";
  EXPECT_TRUE(take_learned_writes().empty()) << "nothing written, nothing to say";

  // The learning run uses another direction, so that its controller is a fresh one.
  settings on;
  {
    scheduled_transfer s(on, env.dev, io_dir::read, io_client::host, std::size_t{1} << 40);
    converge(s, on, env.dev, io_dir::read);
    ASSERT_NE(schedule_reason(on, env.dev, io_dir::read, io_client::host).find("converged"), std::string::npos);
    EXPECT_FALSE(fs::exists(env.learned_file())) << "written before the transfer ended";
  }
  const auto r = load_learned(env.learned_file(), identify_device("/", env.dev));
  ASSERT_TRUE(r.learned) << r.reason;
  ASSERT_EQ(r.learned->shapes.count("host-read"), 1u);
  const learned_shape& got = r.learned->shapes.at("host-read");
  EXPECT_GT(got.gib_per_s, 0);
  EXPECT_FALSE(got.updated.empty());
  EXPECT_EQ(r.learned->shapes.count("host-write"), 0u);
  // What was written is said once, in the one line a command prints after its transfers.
  const auto writes = take_learned_writes();
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].key, "host-read");
  EXPECT_EQ(writes[0].shape, got.shape);
  const std::string line = learned_notice(writes);
  EXPECT_EQ(line.rfind("learned: host reads depth ", 0), 0u) << line;
  EXPECT_NE(line.find("gdskit tune --forget "), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_TRUE(take_learned_notice().empty()) << "said twice";

  // Another transfer that ends at the same shape and rate does not write again.
  const auto before = fs::last_write_time(env.learned_file());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    scheduled_transfer s(on, env.dev, io_dir::read, io_client::host, std::size_t{1} << 40);
    s.start(std::size_t{1} << 40);
  }
  EXPECT_EQ(fs::last_write_time(env.learned_file()), before);
  EXPECT_TRUE(take_learned_writes().empty());
}

// However many shapes a command wrote, it says so in one line, per device, with the command that drops them.
TEST(learned_profile, the_notice_is_one_line_per_command) {
  EXPECT_EQ(learned_notice({}), "");
  const std::string one = learned_notice({{"nvme0n1", "host-read", {8, kMiB}}});
  EXPECT_EQ(one, "learned: host reads depth 8 x 1.00 MiB on nvme0n1 (gdskit tune --forget nvme0n1 drops it)");
  // A key written twice shows its last shape; a second device follows in the same line; a device without a
  // block name is named by its identity, quoted for the shell and escaped for the terminal.
  const std::string many = learned_notice({{"vda", "host-read", {2, 4 * kMiB}},
                                           {"vda", "staged-write", {4, 8 * kMiB}},
                                           {"vda", "host-read", {4, 4 * kMiB}},
                                           {"dev=7:3 loop\x1b", "host-write", {1, kMiB}}});
  EXPECT_EQ(many,
            "learned: host reads depth 4 x 4.00 MiB, staged writes depth 4 x 8.00 MiB on vda (gdskit tune --forget "
            "vda drops it); host writes depth 1 x 1.00 MiB on dev=7:3 loop\\x1b (gdskit tune --forget "
            "'dev=7:3 loop\\x1b' drops it)");
  // Any character the shell would act on is quoted, not only spaces and quotes.
  EXPECT_NE(learned_notice({{"wwid=a;reboot", "host-read", {8, kMiB}}}).find("--forget 'wwid=a;reboot' drops"),
            std::string::npos);
}

// A shape found while a setting pinned the depth or the request size is that setting's answer, not the
// device's: the next process without the setting must not start from it.
TEST(learned_profile, shapes_found_with_a_pinned_coordinate_are_not_remembered) {
  cache_env env;
  settings depth_pinned;
  depth_pinned.direct_depth = 1;
  depth_pinned.direct_depth_set = true;
  {
    scheduled_transfer s(depth_pinned, env.dev, io_dir::read, io_client::host, std::size_t{1} << 40);
    converge(s, depth_pinned, env.dev, io_dir::read);
    ASSERT_NE(schedule_reason(depth_pinned, env.dev, io_dir::read, io_client::host).find("converged"),
              std::string::npos);
  }
  settings size_pinned;
  size_pinned.chunk_bytes = kMiB;
  size_pinned.chunk_bytes_set = true;
  {
    scheduled_transfer s(size_pinned, env.dev, io_dir::write, io_client::host, std::size_t{1} << 40);
    converge(s, size_pinned, env.dev, io_dir::write);
    ASSERT_NE(schedule_reason(size_pinned, env.dev, io_dir::write, io_client::host).find("converged"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(env.learned_file())) << "a pinned search was remembered as the device's shape";
}

// A learned or tuned shape sizes lanes (pinned memory and threads) and queue depth: it starts a transfer only
// within the bounds of the client it is for, whatever the file says. A learned depth of 1024 had given the
// staged path 1,024 lanes; a tuned depth of 32 is held to the staged path's 16 and kept by the host engine.
TEST(learned_profile, shapes_from_files_are_held_to_the_clients_bounds) {
  cache_env env;
  env.learn("staged-read", {{1024, 1024 * kMiB}, 3.0, ""});
  settings cfg;
  scheduled_transfer s(cfg, env.dev, io_dir::read, io_client::staged, std::size_t{1} << 30);
  EXPECT_EQ(s.max_shape().depth, k_staged_max_depth);
  EXPECT_LE(s.max_shape().request_bytes, cfg.staging_slot_bytes);
  EXPECT_LE(s.shape().depth, k_staged_max_depth);
  const std::string why = schedule_reason(cfg, env.dev, io_dir::read, io_client::staged);
  EXPECT_NE(why.find("depth 1024 held to 16"), std::string::npos) << why;
  // Cut, it is a starting point, not a shape to hold.
  EXPECT_EQ(why.find("holding the learned shape"), std::string::npos) << why;
}

TEST(learned_profile, host_shapes_from_files_are_held_to_the_host_bounds) {
  cache_env env;
  env.learn("host-write", {{1024, 512 * kMiB}, 3.0, ""});
  settings cfg;
  scheduled_transfer s(cfg, env.dev, io_dir::write, io_client::host, std::size_t{1} << 30);
  EXPECT_EQ(s.max_shape().depth, k_host_max_depth);
  EXPECT_EQ(s.max_shape().request_bytes, k_host_max_request_bytes);
  const std::string why = schedule_reason(cfg, env.dev, io_dir::write, io_client::host);
  EXPECT_NE(why.find("depth 1024 held to 64"), std::string::npos) << why;
  EXPECT_NE(why.find("512.00 MiB held to 16.00 MiB"), std::string::npos) << why;
}

TEST(learned_profile, a_tuned_depth_of_32_is_held_to_16_lanes_by_the_staged_path_only) {
  cache_env env;
  device_profile p;
  p.device = identify_device("/", env.dev);
  p.read = {32, 8 * kMiB};
  p.write = {32, 8 * kMiB};
  p.read_gib_per_s = p.write_gib_per_s = 2;
  save_profile(env.t.path() / "cache/gdskit", p);
  settings cfg;
  scheduled_transfer staged(cfg, env.dev, io_dir::read, io_client::staged, std::size_t{1} << 30);
  EXPECT_EQ(staged.max_shape().depth, k_staged_max_depth);
  EXPECT_LE(staged.shape().depth, k_staged_max_depth);
  scheduled_transfer host(cfg, env.dev, io_dir::read, io_client::host, std::size_t{1} << 30);
  EXPECT_EQ(host.shape().depth, 32u);
  EXPECT_EQ(host.max_shape().depth, k_host_max_depth);
}

// doctor names the learned shapes of the device it checks; what it prints from the file is only what passed
// the checks.
TEST(learned_profile, doctor_lists_the_learned_shapes) {
  cache_env env;
  env.learn("staged-read", {{4, kMiB}, 5.83, "2026-12-01T16:18:15Z"});
  auto root = doctor::system_root::live_system();
  doctor::facts f;
  const doctor::layer l = doctor::check_storage(root, f, env.t.path().string());
  const doctor::check* c = nullptr;
  for (const auto& k : l.checks) {
    if (k.id == "storage.profile") c = &k;
  }
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->summary.find("learned here: staged-read depth 4, 1.00 MiB at 5.83 GiB/s (2026-12-01T16:18:15Z)"),
            std::string::npos)
      << c->summary;
}

}  // namespace
}  // namespace gdskit::engine
