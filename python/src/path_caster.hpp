// Paths from Python as the extension takes them: str, bytes or os.PathLike, converted as Python's own open()
// converts them. pybind11's stock caster (pybind11/stl/filesystem.h) clears the conversion's error and reports
// "incompatible function arguments" (a TypeError listing signatures) for a path holding a NUL byte or a str with
// no bytes in the file system's encoding; this one raises what open() raises: ValueError ("embedded null
// byte") or UnicodeEncodeError. Every file of the extension includes this header instead of the stock one (one
// caster per type in a program).
#pragma once

#ifdef PYBIND11_HAS_FILESYSTEM
#error "include path_caster.hpp instead of <pybind11/stl/filesystem.h>: one caster for std::filesystem::path"
#endif

#include <pybind11/pybind11.h>

#include <filesystem>
#include <string>

namespace pybind11::detail {

template <>
struct type_caster<std::filesystem::path> {
  PYBIND11_TYPE_CASTER(std::filesystem::path, const_name("os.PathLike"));

  bool load(handle src, bool) {
    // Not a path at all (None, a number, a list): pybind11 tries the next overload or lists the signatures.
    PyObject* fs = PyOS_FSPath(src.ptr());
    if (fs == nullptr) {
      PyErr_Clear();
      return false;
    }
    PyObject* native = nullptr;
    const int ok = PyUnicode_FSConverter(fs, &native);
    Py_DECREF(fs);
    // A path that cannot be one: raised as it is, as open() raises it.
    if (ok == 0) throw error_already_set();
    value = PyBytes_AS_STRING(native);
    Py_DECREF(native);
    return true;
  }

  static handle cast(const std::filesystem::path& path, return_value_policy, handle) {
    object text = reinterpret_steal<object>(
        PyUnicode_DecodeFSDefaultAndSize(path.native().c_str(), static_cast<ssize_t>(path.native().size())));
    if (!text) throw error_already_set();
    return module_::import("pathlib").attr("Path")(text).release();
  }
};

}  // namespace pybind11::detail
