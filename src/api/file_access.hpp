// The inside of gdskit::file_handle: the engine's open_file, reached by gdskit's own layers through
// file_access, never through the public header.
#pragma once

#include <memory>

#include "engine/open_file.hpp"
#include "gdskit/file.hpp"

namespace gdskit {

struct file_handle::impl : engine::open_file {
  using open_file::open_file;
};

/// The inside of a handle: EBADF when the handle is empty.
struct file_access {
  static const file_handle::impl& open_impl(const file_handle& f, const char* op) { return open_impl(f.impl_, op); }
  static const file_handle::impl& open_impl(const std::shared_ptr<file_handle::impl>& m, const char* op);
  static const std::shared_ptr<file_handle::impl>& shared(const file_handle& f) noexcept { return f.impl_; }
  /// A handle that shares `m` (the same open file).
  static file_handle wrap(std::shared_ptr<file_handle::impl> m) noexcept {
    file_handle h;
    h.impl_ = std::move(m);
    return h;
  }
};

namespace detail {
/// The engine's view of an open handle (tests of the engine's paths use it); throws EBADF when empty.
inline const engine::open_file& open_file_of(const file_handle& f) { return file_access::open_impl(f, "open_file"); }
}  // namespace detail

}  // namespace gdskit
