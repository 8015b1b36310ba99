// gdskit doctor: layered diagnosis of GPUDirect Storage on a live system or a captured system root.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include "doctor/probe.hpp"
#include "doctor/report.hpp"
#include "doctor/system_root.hpp"
#include "doctor/tar_reader.hpp"

namespace gdskit::doctor {

/// Runs all static checks on `root` for the storage `path` (as seen on that system), takes the probe
/// results if any, and decides the verdict. Never throws on bad system files.
report diagnose(system_root& root, const std::string& path, std::optional<probe_results> probe = std::nullopt);

/// The storage path to examine when none is given: the live current folder, or for a capture the path
/// recorded in commands/doctor-path.txt ("/" when absent).
std::string default_path(system_root& root);

/// The fix for a failed probe step (`id` "probe.handle_register", ...; `code` its cuFile status or -errno;
/// `device` "maj:min" of the test file, may be empty). Empty when nothing specific is known.
std::string probe_fix(const std::string& id, int code, const std::string& device);

/// Human-readable report: the verdict line first, then each layer with its checks, evidence and fixes.
/// `colour` adds ANSI colours (only for a terminal). Without `all_layers`, a machine with no usable NVIDIA GPU
/// (no driver loaded, or no GPU known to it) gets a few lines instead: that first, the GPU checks that failed
/// with their evidence and fix, and how to see the other layers.
std::string render_text(const report& r, bool colour, bool all_layers = true);

/// The report as JSON with stable keys (schema "gdskit.doctor/1"), pretty-printed.
std::string render_json(const report& r);

/// Writes a capture of what `root` recorded (the files the checks read and the command outputs) as a
/// gzip-compressed tar at `out`. Uses /bin/tar on a staging folder; the archive is written through the syscall
/// seam. Returns an error code on failure (ENOSPC on a full disk), and then no file is left at `out`.
std::error_code write_capture(const system_root& root, const std::string& path, const std::filesystem::path& out);
/// The same, with `why` saying what failed in one phrase for a message ("cannot create it: the folder /x does not
/// exist", "No space left on device").
std::error_code write_capture(const system_root& root, const std::string& path, const std::filesystem::path& out,
                              std::string& why);

/// A fresh folder only this process uses (mkdtemp under $TMPDIR), removed with its contents at destruction.
class private_folder {
 public:
  private_folder();
  ~private_folder();
  private_folder(const private_folder&) = delete;
  private_folder& operator=(const private_folder&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  std::error_code error() const noexcept { return error_; }

 private:
  std::filesystem::path path_;
  std::error_code error_;
};

/// Unpacks a capture archive (.tar.gz from write_capture) into `dest`, an empty private folder: gzip
/// decompresses it (reading the archive as its standard input) and the tar stream is checked header by header
/// as it is written out (tar_reader). Refuses (EINVAL, `why` says what) archives with links or special files,
/// absolute names, "..", more members or more bytes than `limits` (100000, 512 MiB); on any error `dest` is
/// left empty.
std::error_code extract_capture(const std::filesystem::path& archive, const std::filesystem::path& dest,
                                std::string& why, const tar_limits& limits = {});

}  // namespace gdskit::doctor
