// The file side of gdskit's PyTorch Distributed Checkpoint backend (gdskit/torch_dcp.py): data files written
// whole or not at all, every file's ranges in one batch.
#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "bindings.hpp"
#include "gdskit/batch.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "posix/atomic_publish.hpp"

namespace gdskit::python {
namespace {

using ranges_t = std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t, int>>;

// One data file in the making.
struct pending {
  std::filesystem::path target;
  posix::atomic_publish publish;
  file_handle handle;
};

// Errors about a temporary file are said about its final name.
[[noreturn]] void rethrow_named(const error& e, const std::vector<pending>& files) {
  for (const auto& f : files) {
    if (e.path() != f.publish.temp_path().string()) continue;
    const std::string how = "through its temporary file";
    throw error(e.code(), e.operation(), f.target.string(), e.offset_bytes(), e.nbytes(),
                e.detail().empty() ? how : e.detail() + "; " + how);
  }
  throw e;
}

// Writes every file under a temporary name (space reserved first, so a full disk fails before any byte is
// written), all files' ranges as one batch; with `sync`, fdatasync of each file; then the renames over the final
// names and, with `sync`, one fsync per folder. An error removes every temporary file and renames nothing.
std::pair<std::uint64_t, double> write_files(const std::vector<std::pair<std::filesystem::path, ranges_t>>& in,
                                             bool sync) {
  std::vector<pending> files;
  files.reserve(in.size());
  std::vector<io_range> ranges;
  double sync_seconds = 0;
  try {
    for (const auto& [target, list] : in) {
      files.push_back({target, posix::atomic_publish(target, true), {}});
      pending& p = files.back();  // listed before its file is created, so errors about it are renamed
      p.handle = file_handle(p.publish.temp_path(), open_mode::write, {.create = true, .exclusive = true, .permissions = 0666});
      std::uint64_t end = 0;
      for (const auto& [ptr, n, off, dev] : list) end = std::max<std::uint64_t>(end, off + n);
      if (end > 0) p.handle.reserve(end);
    }
    for (std::size_t i = 0; i < in.size(); ++i) {
      for (const auto& [ptr, n, off, dev] : in[i].second) ranges.push_back({&files[i].handle, off, view_for(ptr, n, dev)});
    }
    const batch_result res = gdskit::transfer(io_direction::write, ranges);
    for (std::size_t i = 0; i < res.ranges.size(); ++i) {
      if (res.ranges[i].ok()) continue;
      throw error(res.ranges[i].error, "pwrite", ranges[i].file->path().string(),
                  static_cast<std::int64_t>(ranges[i].offset_bytes), ranges[i].memory.nbytes);
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (sync) {
      for (auto& f : files) f.handle.sync();
    }
    for (auto& f : files) f.handle.close();
    std::set<std::filesystem::path> folders;
    for (auto& f : files) {
      f.publish.rename();
      folders.insert(f.target.has_parent_path() ? f.target.parent_path() : std::filesystem::path("."));
    }
    if (sync) {
      for (const auto& folder : folders) posix::sync_folder(folder);
    }
    sync_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {res.nbytes, sync_seconds};
  } catch (const error& e) {
    rethrow_named(e, files);
  }
}

}  // namespace

void register_checkpoint(py::module_& m) {
  m.def(
      "write_files",
      [](const std::vector<std::pair<std::filesystem::path, ranges_t>>& files, bool sync) {
        py::gil_scoped_release unlocked;
        return write_files(files, sync);
      },
      py::arg("files"), py::arg("sync"),
      "Writes [(path, [(ptr, nbytes, file offset, device)])], each file whole or not at all (temporary name, "
      "rename), every range in one batch; with sync, fdatasync of each file and fsync of their folders. Returns "
      "(bytes written, seconds of syncs and renames).");
}

}  // namespace gdskit::python
