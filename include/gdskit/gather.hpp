// Row gathers: rows of a table stored in a file (a .npy array, or raw fixed-size rows) at any indices, into one
// contiguous destination in host or GPU memory, as one batch. The primitive of vector retrieval and feature
// stores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gdskit/batch.hpp"
#include "gdskit/buffer.hpp"
#include "gdskit/file.hpp"

namespace gdskit {

/// Where the rows of a file lie: `nrows` rows of `row_bytes` each, the first at `data_offset_bytes`.
struct row_layout {
  std::uint64_t data_offset_bytes = 0;
  std::size_t row_bytes = 0;
  std::uint64_t nrows = 0;
};

/// A numpy type string ("<f4", "|u1", ">i8", "<c16", "|S10"): byte order, kind and item size.
struct npy_type {
  char byte_order = '|';     ///< '<' little-endian, '>' big-endian, '|' not applicable, '=' native
  char kind = 0;             ///< 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex, 'S' bytes, 'V' raw
  std::size_t itemsize = 0;  ///< bytes per element, at least 1
  /// bool, integers, floats and complex numbers: values that frameworks hold as numbers.
  bool numeric() const noexcept { return kind == 'b' || kind == 'i' || kind == 'u' || kind == 'f' || kind == 'c'; }
};

/// Parses a numpy type string of the kinds .npy files hold as plain rows (b i u f c S V; no records, objects,
/// strings or dates): nullopt for anything else, with `why` (when given) saying what is wrong. Never throws
/// except std::bad_alloc.
std::optional<npy_type> parse_npy_type(std::string_view descr, std::string* why = nullptr);

/// The header of a .npy file (format versions 1.0, 2.0 and 3.0), as numpy.lib.format writes it.
struct npy_header {
  std::string descr;                 ///< numpy type string: "<f4", "|u1", "<f2", "|b1", ...
  bool fortran_order = false;
  std::vector<std::uint64_t> shape;  ///< () for a scalar
  std::uint64_t data_offset_bytes = 0;
  std::size_t itemsize = 0;          ///< bytes per element, from descr
  /// The rows: the first axis, each row the product of the other axes (a 1-D array has rows of one element).
  row_layout rows() const;
};

/// Parses the header of the .npy file open as `f`. Throws gdskit::error (EBADMSG, naming the file) for a file
/// that is not a .npy file, a header that is malformed or larger than 1 MiB, a structured or object dtype, a
/// shape whose size overflows, or a file shorter than the array it declares; ENOTSUP for Fortran order.
npy_header read_npy_header(const file_handle& f);

/// Reads rows `indices` (any order, duplicates allowed; each in [0, nrows)) of `layout` in `f` into `out`, row
/// k of the result at out + k x row_bytes. `out` is host or GPU memory of at least indices.size() x row_bytes.
/// Throws gdskit::error before any I/O for bad arguments: EINVAL for an index out of range (naming it and its
/// position), `out` too small, rows of 0 bytes, or a layout whose rows end past the largest file offset. Returns the batch's result (exact reads: a row cut short by the end of the
/// file fails with ENODATA); the caller checks ok().
batch_result gather_rows(const file_handle& f, const row_layout& layout, std::span<const std::int64_t> indices,
                         buffer_view out, const batch_options& options = {});

}  // namespace gdskit
