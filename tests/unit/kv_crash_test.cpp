// Crash safety: a child process writes (and reads) blocks while the parent kills it with SIGKILL at a random
// moment; the store must open again, rebuild its index, stay within its capacity, and serve every key the
// child ever put either with exactly the bytes put or as a miss. Rounds alternate cache and persist stores,
// and the capacity is small so that evictions and checkpoints are in flight when the kill lands.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "gdskit/kv.hpp"
#include "kv/format.hpp"
#include "test_support.hpp"

extern char** environ;

namespace gdskit::kv {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t block = 16384;
constexpr std::size_t per_call = 8;
constexpr std::int64_t round_stride = 1000000;

store_options crash_options(const std::string& dir, bool persist) {
  store_options o;
  o.paths = {std::filesystem::path(dir) / (persist ? "persist" : "cache")};
  o.block_bytes = block;
  o.capacity_bytes = capacity_for(300, block);
  o.name_space = "crash";
  o.mode = persist ? durability::persist : durability::cache;
  o.deadline = 10s;
  return o;
}

std::vector<std::uint8_t> content(const key& k) { return test::random_bytes(block, k.hash()); }

// The writer: runs only as the child of the test below (the environment says where), puts blocks forever and
// records before each call how far it got in a small file the parent reads after the kill.
TEST(kv_crash, child_writer) {
  const char* dir = std::getenv("GDSKIT_KV_CRASH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "the writer half of kv_crash: runs as a child of the kill test";
  const bool persist = std::string(std::getenv("GDSKIT_KV_CRASH_MODE")) == "persist";
  const std::int64_t base = std::atoll(std::getenv("GDSKIT_KV_CRASH_BASE"));
  const int report = ::open(std::getenv("GDSKIT_KV_CRASH_PROGRESS"), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(report, 0);
  block_store s(crash_options(dir, persist));
  std::vector<std::vector<std::uint8_t>> data(per_call);
  std::vector<buffer_view> views(per_call);
  std::vector<std::uint8_t> out(per_call * block);
  for (std::int64_t i = 0;; i += per_call) {
    std::vector<key> keys;
    for (std::size_t j = 0; j < per_call; ++j) {
      keys.push_back(key::from_int(base + i + static_cast<std::int64_t>(j)));
      data[j] = content(keys.back());
      views[j] = buffer_view::host(data[j].data(), block);
    }
    const std::int64_t upto = i + static_cast<std::int64_t>(per_call);
    // Reported before the put: the parent checks every key that may have been started.
    if (::pwrite(report, &upto, sizeof upto, 0) != sizeof upto) std::_Exit(3);
    s.put(keys, views);
    if (i % 64 == 0) {  // reads too, so that a kill can land in one
      std::vector<buffer_view> ov;
      for (std::size_t j = 0; j < per_call; ++j) ov.push_back(buffer_view::host(out.data() + j * block, block));
      s.get(keys, ov);
    }
  }
}

TEST(kv_crash, kill_9_at_random_points_then_every_get_is_right_or_a_miss) {
  test::temp_dir dir;
  std::mt19937_64 rng(2024);
  const int rounds = test::sanitized ? 4 : 12;
  std::vector<std::int64_t> written(rounds, 0);  // per round: keys base .. base + written[r] may exist
  std::size_t total_hits = 0;
  for (int round = 0; round < rounds; ++round) {
    const bool persist = round % 2 == 1;
    const std::filesystem::path progress = dir.path() / "progress";
    std::int64_t zero = 0;
    test::write_file(progress, std::vector<std::uint8_t>(reinterpret_cast<std::uint8_t*>(&zero),
                                                         reinterpret_cast<std::uint8_t*>(&zero) + sizeof zero));
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "GDSKIT_KV_CRASH_", 16) != 0) env_text.emplace_back(*e);
    }
    env_text.push_back("GDSKIT_KV_CRASH_DIR=" + dir.path().string());
    env_text.push_back(std::string("GDSKIT_KV_CRASH_MODE=") + (persist ? "persist" : "cache"));
    env_text.push_back("GDSKIT_KV_CRASH_BASE=" + std::to_string(round * round_stride));
    env_text.push_back("GDSKIT_KV_CRASH_PROGRESS=" + progress.string());
    std::vector<char*> envp;
    for (auto& s : env_text) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=kv_crash.child_writer";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 900));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended on its own (status " << status << ")";
    const auto bytes = test::read_file(progress);
    ASSERT_EQ(bytes.size(), sizeof(std::int64_t));
    std::memcpy(&written[round], bytes.data(), sizeof(std::int64_t));

    for (bool mode : {false, true}) {
      store_options reopen = crash_options(dir.path().string(), mode);
      reopen.ignore_checkpoint = round % 4 >= 2;  // every other pair of rounds rebuilds from the headers alone
      block_store s(reopen);  // must open: the kernel dropped the writer's lock
      const store_stats st = s.stats();
      if (mode == persist) {
        std::printf("round %d (%s): writer reached key %lld; reopened in %.1f ms with %llu blocks (%s, %llu headers read)\n",
                    round, persist ? "persist" : "cache", static_cast<long long>(written[round]),
                    st.recovery.seconds * 1e3, static_cast<unsigned long long>(st.recovery.blocks),
                    st.recovery.from_checkpoint ? "checkpoint" : "full scan",
                    static_cast<unsigned long long>(st.recovery.headers_read));
      }
      EXPECT_LE(st.physical_bytes, crash_options(dir.path().string(), mode).capacity_bytes);
      EXPECT_LE(st.blocks, st.slots);
      // Every key any writer of this store may have put: right bytes or a miss, never anything else.
      for (int r = mode ? 1 : 0; r <= round; r += 2) {
        for (std::int64_t first = 0; first < written[r]; first += 64) {
          std::vector<key> keys;
          for (std::int64_t i = first; i < std::min<std::int64_t>(written[r], first + 64); ++i) {
            keys.push_back(key::from_int(r * round_stride + i));
          }
          std::vector<std::uint8_t> out(keys.size() * block, 0xEE);
          std::vector<buffer_view> ov;
          for (std::size_t j = 0; j < keys.size(); ++j) ov.push_back(buffer_view::host(out.data() + j * block, block));
          const op_result g = s.get(keys, ov);
          for (std::size_t j = 0; j < keys.size(); ++j) {
            if (!g.ok[j]) continue;
            ++total_hits;
            ASSERT_EQ(std::memcmp(out.data() + j * block, content(keys[j]).data(), block), 0)
                << "wrong bytes for key " << keys[j].to_string() << " after the kill of round " << round;
          }
        }
      }
    }
  }
  EXPECT_GT(total_hits, 0u) << "no block survived any kill: the test proved nothing";
}

}  // namespace
}  // namespace gdskit::kv
