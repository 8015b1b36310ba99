// The transfer core: every batch (and every single-range transfer, as a batch of one) is handed to it; it
// splits the batch into routes (host, staged, cuFile) and runs them.
#pragma once

#include <memory>

#include "engine/transfer/batch_state.hpp"

namespace gdskit::engine {

class transfer_core {
 public:
  static transfer_core& instance();

  /// Starts moving the batch's ranges and returns. Takes over the batch's submission hold (attach_files) and
  /// gives it back once it will start no further request for the batch.
  void run(const std::shared_ptr<detail::batch_state>& batch);
};

}  // namespace gdskit::engine
