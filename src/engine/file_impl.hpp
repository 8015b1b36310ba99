// The inside of gdskit::file_handle, shared with the GPU paths (they reuse its descriptors and planner).
#pragma once

#include <filesystem>
#include <vector>

#include "engine/io_engine.hpp"
#include "gdskit/file.hpp"
#include "posix/syscalls.hpp"

namespace gdskit {

struct file_handle::impl {
  std::filesystem::path path;
  open_mode mode = open_mode::read;
  settings config;
  io_choice choice;
  posix::unique_fd fd;         // buffered
  posix::unique_fd direct_fd;  // O_DIRECT, or -1

  /// Splits a request into tasks: aligned O_DIRECT chunks, bounce or buffered pieces at the edges.
  std::vector<engine::io_task> plan(bool write, std::byte* buf, std::size_t nbytes, std::uint64_t offset) const;
  /// Runs tasks inline (small requests) or on the chosen engine.
  void execute(std::vector<engine::io_task>& tasks, std::size_t nbytes) const;
  void throw_first_error(const std::vector<engine::io_task>& tasks, const char* op) const;
  std::uint64_t current_size() const;
  std::size_t read(void* buf, std::size_t nbytes, std::uint64_t offset) const;
  std::size_t write(const void* buf, std::size_t nbytes, std::uint64_t offset) const;
};

}  // namespace gdskit
