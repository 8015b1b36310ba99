#include "tools/signal_cleanup.hpp"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <utility>

namespace gdskit {
namespace {

// The handler may only use async-signal-safe calls: fixed buffers, atomics and unlink(2).
struct slot {
  std::atomic<int> state{0};  // 0 free, 1 being written, 2 registered
  char path[4096];
};
std::array<slot, kMaxSignalCleanupFiles> g_slots;

extern "C" void on_terminating_signal(int sig) {
  // Files first (unlink refuses folders with EISDIR), then the folders they emptied.
  for (auto& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);
  }
  for (auto& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) == 2) ::rmdir(s.path);
  }
  ::_exit(128 + sig);
}

}  // namespace

remove_on_signal::remove_on_signal(const std::filesystem::path& path) noexcept {
  const std::string& p = path.native();
  if (p.empty() || p.size() >= sizeof(slot::path)) return;
  for (std::size_t i = 0; i < g_slots.size(); ++i) {
    int expected = 0;
    if (!g_slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    std::memcpy(g_slots[i].path, p.c_str(), p.size() + 1);
    g_slots[i].state.store(2, std::memory_order_release);
    slot_ = static_cast<int>(i);
    return;
  }
}

remove_on_signal::~remove_on_signal() {
  if (slot_ >= 0) g_slots[static_cast<std::size_t>(slot_)].state.store(0, std::memory_order_release);
}

remove_on_signal::remove_on_signal(remove_on_signal&& o) noexcept : slot_(std::exchange(o.slot_, -1)) {}

remove_on_signal& remove_on_signal::operator=(remove_on_signal&& o) noexcept {
  if (this != &o) {
    if (slot_ >= 0) g_slots[static_cast<std::size_t>(slot_)].state.store(0, std::memory_order_release);
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

void install_signal_cleanup() {
  struct sigaction sa {};
  sa.sa_handler = on_terminating_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  for (int sig : {SIGINT, SIGTERM}) {
    // A signal ignored by whoever started us (a shell's background job ignores SIGINT) stays ignored.
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace gdskit
