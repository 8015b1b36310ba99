// Warnings gdskit cannot throw (destructors, cleanup after an error): one line on stderr.
#pragma once

#include <string_view>

namespace gdskit {

/// Writes "gdskit: warning: <message>" and a newline to stderr. Never throws.
void log_warning(std::string_view message) noexcept;

}  // namespace gdskit
