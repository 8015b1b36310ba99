#include "engine/io_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "engine/device_profile.hpp"

namespace gdskit::engine {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct setup {
  bool adaptive = false;
  adaptive_limits limits;
  io_shape start;
  io_shape fixed;        // used when not adaptive
  std::string source;    // where the start came from
  double resume_rate = 0;  // bytes per second of a learned shape held from the start (0: search from start)
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

setup make_setup(const settings& c, dev_t dev, io_dir dir, io_client client) {
  setup s;
  const bool staged = client == io_client::staged;
  const bool request_set = staged ? c.staging_slot_bytes_set : c.chunk_bytes_set;
  const std::size_t request = staged ? c.staging_slot_bytes : c.chunk_bytes;
  s.fixed = {std::min(c.threads, c.direct_depth), request};
  s.adaptive = c.adaptive && !(c.direct_depth_set && request_set);
  if (!s.adaptive) return s;
  s.limits.depth_fixed = c.direct_depth_set;
  s.limits.request_fixed = request_set;
  // Pinned memory grows with lanes x slots x slot size: the staged path stays at 16 lanes at most and its slot size.
  s.limits.max_depth = staged ? k_staged_max_depth : k_host_max_depth;
  s.limits.max_request_bytes = staged ? c.staging_slot_bytes : k_host_max_request_bytes;
  s.limits.min_request_bytes = std::min<std::size_t>(kMiB, s.limits.max_request_bytes);
  s.start = {k_start_shape.depth, std::min(k_start_shape.request_bytes, s.limits.max_request_bytes)};
  const profile_result& p = profile_for_device(dev);
  std::optional<learned_shape> learned;
  std::string learned_on;
  if (p.profile) {
    s.start = dir == io_dir::read ? p.profile->read : p.profile->write;
    s.source = fmt::format("device profile {}", p.profile->device.block.empty() ? p.profile->device.key
                                                                                 : p.profile->device.block);
  } else if (c.learn && (learned = learned_for_device(dev, learned_key(dir, staged), &learned_on))) {
    s.start = learned->shape;
    s.source = fmt::format("learned profile {} ({})", learned_on,
                           p.reason.rfind("no profile (", 0) == 0 ? "no tuned profile: run gdskit tune" : p.reason);
  } else {
    s.source = p.reason;
  }
  // A shape read from a file starts this client only within its bounds (a learned depth of 1024 would pin
  // 1,024 lanes); the limits below are raised only for what a setting pins.
  std::string cut;
  s.start = clamp_to_limits(s.start, s.limits, cut);
  if (!cut.empty()) s.source += fmt::format(", {}", cut);
  if (s.limits.depth_fixed) s.start.depth = s.fixed.depth;
  if (s.limits.request_fixed) s.start.request_bytes = request;
  // A learned shape is held only as it was learned: a pinned coordinate that moved it, or limits that cut it,
  // make it a plain starting point.
  if (learned && s.start == learned->shape && s.start.depth <= s.limits.max_depth &&
      s.start.request_bytes <= s.limits.max_request_bytes &&
      s.start.request_bytes >= s.limits.min_request_bytes) {
    s.resume_rate = learned->gib_per_s * kGiB;
  }
  s.limits.max_depth = std::max(s.limits.max_depth, s.start.depth);
  s.limits.max_request_bytes = std::max(s.limits.max_request_bytes, s.start.request_bytes);
  return s;
}

std::shared_ptr<adaptive_controller> controller(const setup& s, dev_t dev, io_dir dir, io_client client) {
  return controller_for(dev, dir, static_cast<int>(client), s.start, s.limits, s.resume_rate);
}

}  // namespace

scheduled_transfer::scheduled_transfer(const settings& config, dev_t device, io_dir dir, io_client client,
                                       std::size_t nbytes)
    : nbytes_(nbytes), device_(device), dir_(dir), client_(client), learn_(config.learn) {
  setup s = make_setup(config, device, dir, client);
  fixed_ = max_ = s.fixed;
  if (!s.adaptive) return;
  ctl_ = controller(s, device, dir, client);
  // A shape found with a coordinate pinned by a setting is that setting's, not the device's: never remembered.
  if (s.limits.depth_fixed || s.limits.request_fixed) learn_ = false;
  max_ = {s.limits.max_depth, s.limits.max_request_bytes};
  eligible_ = nbytes >= s.limits.min_probe_transfer_bytes;
  planned_request_ = shape().request_bytes;
}

void scheduled_transfer::start(std::size_t direct_bytes) {
  if (ctl_ && direct_bytes > 0 && !probing_) probing_ = ctl_->begin(direct_bytes, steady_now_s());
}

scheduled_transfer::~scheduled_transfer() {
  if (!ctl_) return;
  ctl_->end(probing_, steady_now_s());
  if (probing_ && learn_) remember();
}

void scheduled_transfer::remember() const noexcept {
  // Written when the controller holds a shape that differs from the one remembered, or at a rate that has
  // moved past the drift margin: a few times in a process's life, not per transfer.
  if (!ctl_->converged()) return;
  const io_shape best = ctl_->best();
  const double gib = ctl_->converged_rate() / kGiB;
  if (!(gib > 0)) return;
  const std::string key = learned_key(dir_, client_ == io_client::staged);
  const std::optional<learned_shape> known = learned_for_device(device_, key);
  if (known && known->shape == best && known->gib_per_s > 0 && std::fabs(gib / known->gib_per_s - 1.0) <= 0.3) return;
  remember_learned(device_, key, learned_shape{best, gib, {}});
}

io_shape scheduled_transfer::shape() const {
  if (!ctl_) return fixed_;
  io_shape s = probing_ || eligible_ ? ctl_->shape() : ctl_->best();
  // Concurrent probing transfers (a loader reading two segments at once) share the device's depth.
  if (probing_) s.depth = ctl_->depth_share(s.depth);
  return s;
}

void scheduled_transfer::complete(std::size_t nbytes, std::size_t request_bytes) {
  if (probing_) ctl_->complete(nbytes, steady_now_s(), request_bytes != 0 ? request_bytes : planned_request_);
}

std::string schedule_reason(const settings& config, dev_t device, io_dir dir, io_client client,
                            std::string_view label) {
  setup s = make_setup(config, device, dir, client);
  const std::string who = label.empty() ? fmt::format("O_DIRECT {} {}", client == io_client::staged ? "staged" : "host",
                                                      dir == io_dir::read ? "reads" : "writes")
                                        : std::string(label);
  if (!s.adaptive) {
    return fmt::format("{}: depth {}, {} (fixed: {})", who, s.fixed.depth,
                       format_size(s.fixed.request_bytes),
                       config.adaptive ? "GDSKIT_DIRECT_DEPTH and the request size set" : "GDSKIT_ADAPTIVE=off");
  }
  std::string pins;
  if (s.limits.depth_fixed) {
    // The value the user set; the workers of GDSKIT_THREADS bound the depth that runs.
    pins += fmt::format("; GDSKIT_DIRECT_DEPTH={} wins", config.direct_depth);
    if (s.fixed.depth < config.direct_depth) pins += fmt::format(", held to GDSKIT_THREADS={}", config.threads);
  }
  if (s.limits.request_fixed) {
    pins += fmt::format("; {}={} wins", client == io_client::staged ? "GDSKIT_STAGING_SLOT_BYTES" : "GDSKIT_CHUNK_BYTES",
                        s.fixed.request_bytes);
  }
  return fmt::format("{}: {}; now {}{}", who, s.source, controller(s, device, dir, client)->describe(), pins);
}

}  // namespace gdskit::engine
