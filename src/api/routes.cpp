#include "api/routes.hpp"

#include <mutex>

#include "engine/transfer/core.hpp"
#include "gpu/routes.hpp"

namespace gdskit::detail {

void ensure_routes() {
  static std::once_flag once;
  std::call_once(once, [] { engine::transfer_core::instance().install(gpu::make_backend()); });
}

}  // namespace gdskit::detail
