// The GPU layer's routes for the transfer core: pinned lanes for the staged pipeline, cuFile, and the batch
// driver's group copier.
#pragma once

#include <memory>

#include "engine/transfer/route.hpp"

namespace gdskit::gpu {

std::unique_ptr<engine::gpu_backend> make_backend();

}  // namespace gdskit::gpu
