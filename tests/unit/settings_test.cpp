// The process-wide settings: precedence (code > environment > default), the source of each value, the *_set
// flags the scheduler reads, refused values changing nothing, save and restore, and reads and writes from many
// threads at once.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cerrno>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"
#include "test_support.hpp"

namespace gdskit {
namespace {

setting_entry entry(const std::vector<setting_entry>& all, const std::string& name) {
  for (const auto& e : all) {
    if (e.name == name) return e;
  }
  throw std::runtime_error("no setting " + name);
}

setting_source source_of(const std::string& name) { return entry(describe_settings(), name).source; }

// Sets an environment variable for the test's duration.
struct scoped_env {
  std::string name;
  scoped_env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

TEST(settings_precedence, code_over_environment_over_default) {
  test::settings_guard guard;
  reset_setting("threads");
  EXPECT_EQ(source_of("threads"), setting_source::defaults);
  {
    scoped_env e("GDSKIT_THREADS", "3");
    reset_setting("threads");  // reads the variable again
    EXPECT_EQ(default_settings().threads, 3u);
    EXPECT_EQ(source_of("threads"), setting_source::environment);
    set_setting("threads", "5");
    EXPECT_EQ(default_settings().threads, 5u);
    EXPECT_EQ(source_of("threads"), setting_source::code);
    reset_setting("threads");
    EXPECT_EQ(default_settings().threads, 3u);
  }
  reset_setting("threads");
  EXPECT_EQ(source_of("threads"), setting_source::defaults);
  EXPECT_GE(default_settings().threads, 4u);
  EXPECT_LE(default_settings().threads, 16u);
}

// A depth or request size from the environment or from code wins over a device's profile: the scheduler reads
// that from the *_set flags, which follow the sources.
TEST(settings_precedence, set_flags_follow_the_sources) {
  test::settings_guard guard;
  for (const char* name : {"direct_depth", "chunk_bytes", "staging_slot_bytes"}) reset_setting(name);
  settings s = default_settings();
  EXPECT_FALSE(s.direct_depth_set || s.chunk_bytes_set || s.staging_slot_bytes_set);
  set_setting("direct_depth", "4");
  set_setting("chunk_bytes", "1M");
  s = default_settings();
  EXPECT_TRUE(s.direct_depth_set && s.chunk_bytes_set);
  EXPECT_FALSE(s.staging_slot_bytes_set);
  EXPECT_EQ(s.direct_depth, 4u);
  EXPECT_EQ(s.chunk_bytes, 1u << 20);
  {
    scoped_env e("GDSKIT_STAGING_SLOT_BYTES", "2M");
    reset_setting("staging_slot_bytes");
    EXPECT_TRUE(default_settings().staging_slot_bytes_set);
  }
  reset_setting("direct_depth");
  EXPECT_FALSE(default_settings().direct_depth_set);
  // A whole settings object from code: what differs, and what its flags mark, counts as set in code.
  settings next = default_settings();
  next.threads = 7;
  next.staging_slot_bytes_set = true;
  set_default_settings(next);
  EXPECT_EQ(source_of("threads"), setting_source::code);
  EXPECT_EQ(source_of("staging_slot_bytes"), setting_source::code);
  EXPECT_EQ(source_of("engine"), setting_source::defaults);
}

TEST(settings_values, every_setting_reads_back_what_was_set) {
  test::settings_guard guard;
  const std::pair<const char*, const char*> cases[] = {
      {"threads", "6"},         {"adaptive", "off"},         {"learn", "off"},         {"direct_depth", "8"},
      {"chunk_bytes", "2M"},    {"inline_bytes", "64K"},   {"direct", "off"},        {"engine", "threads"},
      {"mode", "staged"},       {"staging_slots", "3"},      {"cached_slot_bytes", "1M"}, {"staging_slot_bytes", "16M"},
      {"copy_kernel", "off"},  {"copy_kernel_bytes", "256K"}, {"registered_staging", "off"}};
  std::set<std::string> named;
  for (const auto& [name, value] : cases) {
    set_setting(name, value);
    named.insert(name);
    const setting_entry e = entry(describe_settings(), name);
    EXPECT_EQ(e.value, value) << name;
    EXPECT_EQ(e.source, setting_source::code) << name;
    EXPECT_EQ(e.variable.rfind("GDSKIT_", 0), 0u) << name;
    EXPECT_FALSE(e.help.empty()) << name;
  }
  // Every setting has a case above: the table and this test agree.
  for (const auto& e : describe_settings()) EXPECT_TRUE(named.count(e.name)) << e.name;
  const settings s = default_settings();
  EXPECT_EQ(s.threads, 6u);
  EXPECT_FALSE(s.adaptive);
  EXPECT_FALSE(s.learn);
  EXPECT_EQ(s.inline_bytes, 65536u);
  EXPECT_EQ(s.direct, direct_mode::off);
  EXPECT_EQ(s.engine, engine_kind::threads);
  EXPECT_EQ(s.mode, path_mode::staged);
  EXPECT_EQ(s.staging_slots, 3u);
  EXPECT_EQ(s.cached_slot_bytes, 1u << 20);
  EXPECT_EQ(s.staging_slot_bytes, 16u << 20);
  EXPECT_FALSE(s.copy_kernel);
  EXPECT_EQ(s.copy_kernel_bytes, 256u << 10);
  EXPECT_FALSE(s.registered_staging);
  // Other spellings the variables take.
  set_setting("adaptive", "1");
  EXPECT_TRUE(default_settings().adaptive);
  set_setting("chunk_bytes", "4096");
  EXPECT_EQ(entry(describe_settings(), "chunk_bytes").value, "4K");
}

TEST(settings_values, refused_values_change_nothing_and_name_the_setting) {
  test::settings_guard guard;
  set_setting("threads", "9");
  const settings before = default_settings();
  const std::pair<const char*, const char*> bad[] = {
      {"threads", "0"},     {"threads", "x"},          {"threads", ""},         {"chunk_bytes", "1000"},
      {"direct", "maybe"},  {"adaptive", "yes"},       {"staging_slots", "1"},  {"cached_slot_bytes", "60K"},
      {"no_such", "1"},     {"threads", "9\x1b[2J"},    {"copy_kernel_bytes", "2K"}, {"copy_kernel_bytes", "65M"}};
  for (const auto& [name, value] : bad) {
    try {
      set_setting(name, value);
      FAIL() << name << "=" << value << " accepted";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), std::errc::invalid_argument);
      const std::string what = e.what();
      EXPECT_NE(what.find(name), std::string::npos) << what;
      EXPECT_EQ(what.find('\x1b'), std::string::npos) << "a control byte reached the message";
    }
  }
  const settings after = default_settings();
  EXPECT_EQ(after.threads, before.threads);
  EXPECT_EQ(after.chunk_bytes, before.chunk_bytes);
  EXPECT_EQ(after.staging_slots, before.staging_slots);
  EXPECT_EQ(source_of("chunk_bytes"), setting_source::defaults);
}

TEST(settings_state, restore_puts_back_values_and_sources) {
  test::settings_guard guard;
  reset_setting("engine");
  const settings_state saved = save_settings();
  set_setting("engine", "threads");
  set_setting("threads", "11");
  restore_settings(saved);
  EXPECT_EQ(default_settings().engine, saved.values.engine);
  EXPECT_EQ(default_settings().threads, saved.values.threads);
  EXPECT_EQ(source_of("engine"), setting_source::defaults);
  settings_state broken = saved;
  broken.sources.pop_back();
  EXPECT_THROW(restore_settings(broken), error);
}

// Readers always see a settings object that was set as a whole, while two threads write (under TSan: no race).
TEST(settings_threads, concurrent_reads_and_writes) {
  test::settings_guard guard;
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&] {
      while (!stop) {
        const settings s = default_settings();
        // set_default_settings below always writes direct_depth and staging_slots equal.
        if (s.direct_depth >= 100 && s.direct_depth != s.staging_slots) ++torn;
      }
    });
  }
  std::thread writer_a([&] {
    for (unsigned i = 0; i < 2000; ++i) set_setting("inline_bytes", std::to_string(4096 * (1 + i % 7)));
  });
  std::thread writer_b([&] {
    for (unsigned i = 0; i < 2000; ++i) {
      settings s = default_settings();
      s.direct_depth = s.staging_slots = 100 + i % 50;
      set_default_settings(s);
    }
  });
  writer_a.join();
  writer_b.join();
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace gdskit
