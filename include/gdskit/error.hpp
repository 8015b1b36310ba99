// gdskit's one error type and its categories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace gdskit {

/// Category of cuFile status codes (CUfileOpError values, 5001..; 0 is success).
const std::error_category& cufile_category() noexcept;
/// Category of CUDA driver API results (CUresult values; 0 is success).
const std::error_category& cuda_category() noexcept;

/// The one exception type of gdskit. Its message names the operation, the path, the offset and the size:
///   pread "model.safetensors" at 4096+1048576: Input/output error
/// Compare `code()` in tests and programs, never the message text.
class error : public std::system_error {
 public:
  /// Full form: operation, path (may be empty), file offset and size of the failed request.
  error(std::error_code code, std::string_view operation, std::string_view path, std::int64_t offset_bytes,
        std::size_t nbytes, std::string_view detail = {});
  /// Short form for failures that have no file range (driver calls, allocation).
  error(std::error_code code, std::string_view what);

  const std::string& operation() const noexcept { return operation_; }
  const std::string& path() const noexcept { return path_; }
  /// -1 when the failure has no file offset.
  std::int64_t offset_bytes() const noexcept { return offset_bytes_; }
  std::size_t nbytes() const noexcept { return nbytes_; }
  /// The explanation given with the full form ("file ended after 10 of 20 bytes"), or empty.
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string operation_;
  std::string path_;
  std::string detail_;
  std::int64_t offset_bytes_ = -1;
  std::size_t nbytes_ = 0;
};

/// An errno value as an error_code of the generic category.
inline std::error_code errno_code(int e) noexcept { return {e, std::generic_category()}; }
/// A cuFile status (5001..) as an error_code.
inline std::error_code cufile_code(int status) noexcept { return {status, cufile_category()}; }
/// A CUresult as an error_code.
inline std::error_code cuda_code(int result) noexcept { return {result, cuda_category()}; }

/// Decodes a negative byte count returned by cuFileRead/cuFileWrite: -1 means "see errno" (pass errno_now),
/// a value below -5000 is a cuFile status, any other negative value is -errno.
std::error_code decode_cufile_ssize(long long result, int errno_now) noexcept;

/// Thrown as gdskit::error with errc::io_error by read_exact when the file ends before the request does.
/// `transferred` is how many bytes were read.
class short_read_error : public error {
 public:
  short_read_error(std::string_view path, std::int64_t offset_bytes, std::size_t nbytes, std::size_t transferred);
  std::size_t transferred() const noexcept { return transferred_; }

 private:
  std::size_t transferred_;
};

}  // namespace gdskit
