// Where the paths meet the adaptive controller: which depth and request size one O_DIRECT transfer uses, where
// that comes from (GDSKIT_* settings, the device profile, the controller), and feedback of completed bytes.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "engine/adaptive.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::engine {

/// The host engine and the staged pipeline each keep their own state per device: a staged piece also costs a
/// copy into GPU memory and a slot in the CPU's cache, so their best shapes differ on the same device.
enum class io_client { host, staged };

/// One O_DIRECT transfer's schedule. Construct it, read shape() to plan, start() with the bytes that will go
/// through O_DIRECT, complete() as requests finish; the destructor ends the controller's measurement.
class scheduled_transfer {
 public:
  scheduled_transfer(const settings& config, dev_t device, io_dir dir, io_client client, std::size_t nbytes);
  /// `direct_bytes` of the transfer go through O_DIRECT (0: nothing is measured).
  void start(std::size_t direct_bytes);
  ~scheduled_transfer();
  scheduled_transfer(const scheduled_transfer&) = delete;
  scheduled_transfer& operator=(const scheduled_transfer&) = delete;

  /// The shape to use now (it may change during a probing transfer). The depth of a probing transfer is its
  /// share of the device's: probing transfers running at the same time divide it among them.
  io_shape shape() const;
  /// The largest depth and request size this transfer may be asked to use.
  io_shape max_shape() const { return max_; }
  /// Whether this transfer measures candidates (it may be asked for any shape up to max_shape()).
  bool probing() const { return probing_; }
  /// `nbytes` went through O_DIRECT in requests of `request_bytes` (0: the size shape() had when the transfer
  /// was constructed, for paths that plan their requests once).
  void complete(std::size_t nbytes, std::size_t request_bytes = 0);

 private:
  void remember() const noexcept;

  std::shared_ptr<adaptive_controller> ctl_;
  io_shape fixed_;
  io_shape max_;
  std::size_t nbytes_ = 0;
  std::size_t planned_request_ = 0;
  bool eligible_ = false;  // large enough to probe
  bool probing_ = false;
  dev_t device_ = 0;
  io_dir dir_ = io_dir::read;
  io_client client_ = io_client::host;
  bool learn_ = true;
};

/// The line the plan's reasons carry: "device profile nvme0n1: depth 32, 4.00 MiB; adaptive (...)",
/// "no device profile (...); depth 2, 4.00 MiB; adaptive (...)", "GDSKIT_DIRECT_DEPTH=16 (fixed)", ...
/// `label` replaces the line's leading "O_DIRECT staged writes" (or host, reads) where another user runs on
/// that schedule.
std::string schedule_reason(const settings& config, dev_t device, io_dir dir, io_client client,
                            std::string_view label = {});

}  // namespace gdskit::engine
