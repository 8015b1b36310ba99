// Wires the GPU layer's routes into the transfer core; every public entry point that moves bytes calls it.
#pragma once

namespace gdskit::detail {

/// Installs the GPU routes once per process (cheap after the first call).
void ensure_routes();

}  // namespace gdskit::detail
