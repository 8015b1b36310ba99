// gdskit.File's compiled half (FileHandle), data-path plans and GPU availability.
#include <sys/stat.h>

#include <cerrno>
#include <memory>
#include <string>
#include <tuple>

#include "bindings.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"

namespace gdskit::python {

namespace {

// An open() mode as gdskit.File takes it: r, w or x, then "+" and "b" in either order, each at most once.
struct open_spec {
  gdskit::open_mode mode = gdskit::open_mode::read;
  gdskit::open_options options;
};

[[noreturn]] void refuse_mode(const std::string& text, const std::string& why) {
  throw py::value_error("mode \"" + text + "\": " + why);
}

open_spec parse_mode(const std::string& text) {
  static const std::string expected = "expected \"r\", \"w\" or \"x\", then \"+\" and \"b\" at most once each (\"rb\", \"r+b\", \"w+b\")";
  static const std::string text_mode = "text mode is not supported: gdskit.File moves raw bytes";
  auto refuse = [&text](const std::string& why) { refuse_mode(text, why); };
  if (text.empty()) refuse("empty; use \"r\", \"r+\", \"w\", \"w+\", \"x\" or \"x+\" (\"b\" may be added)");
  bool plus = false, binary = false;
  for (std::size_t i = 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+' && !plus) {
      plus = true;
    } else if (c == 'b' && !binary) {
      binary = true;
    } else if (c == 't') {
      refuse(text_mode);
    } else {
      refuse(expected);
    }
  }
  open_spec s;
  switch (text[0]) {
    case 'r':
      s.mode = plus ? gdskit::open_mode::read_write : gdskit::open_mode::read;
      break;
    case 'w':
      s.options.create = s.options.truncate = true;
      s.mode = plus ? gdskit::open_mode::read_write : gdskit::open_mode::write;
      break;
    case 'x':
      s.options.create = s.options.exclusive = true;
      s.mode = plus ? gdskit::open_mode::read_write : gdskit::open_mode::write;
      break;
    case 'a':
      refuse_mode(text, "append is not supported: reads and writes go to explicit offsets; use \"r+\" for an existing "
             "file or \"w\" to create one");
    case 't':
      refuse_mode(text, text_mode);
    default:
      refuse_mode(text, expected);
  }
  return s;
}

// Files opened for writing must be regular files or new names: opening a FIFO for writing waits for a reader,
// and a device is no place for these writes.
void refuse_special(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // a new name, or an error the open reports with its errno
  if (S_ISDIR(st.st_mode)) throw gdskit::error(gdskit::errno_code(EISDIR), "open", path.string(), -1, 0, "a folder, not a file");
  if (!S_ISREG(st.st_mode)) {
    throw gdskit::error(gdskit::errno_code(EINVAL), "open", path.string(), -1, 0, "not a regular file");
  }
}

}  // namespace

void check_device(int device) {
  if (device < 0) return;
  std::string why;
  if (!gdskit::gpu_available(&why)) raise_no_gpu(device, why);
  const int n = gdskit::gpu_count();
  if (device >= n) {
    raise_os_error(ENODEV, "cuda:" + std::to_string(device) + ": no such device (the machine has " +
                               std::to_string(n) + (n == 1 ? " GPU)" : " GPUs)"), "");
  }
}

namespace {

// (path, reasons) for reading `f` into memory on `device` (-1: host). Without a usable GPU a device plan is
// ENODEV with the reason, as a read to that device would fail.
py::tuple plan_tuple(const gdskit::file_handle& f, int device) {
  gdskit::buffer_view v = gdskit::buffer_view::host(nullptr, 0);
  if (device >= 0) {
    check_device(device);
    v = gdskit::buffer_view{nullptr, 0, gdskit::memory_kind::device, device};
  }
  auto d = f.plan(v);
  return py::make_tuple(std::string(gdskit::to_string(d.path)), d.reasons);
}

}  // namespace

void register_files(py::module_& m) {
  m.def(
      "plan",
      [](const std::filesystem::path& path, int device) {
        gdskit::file_handle f(path, gdskit::open_mode::read);
        return plan_tuple(f, device);
      },
      py::arg("path"), py::arg("device") = 0, "The data path for reading this file to the device, and why.");

  // ---- gdskit.File: one open file, read and written from any thread (the GIL is released during I/O). ----
  py::class_<file_object, std::shared_ptr<file_object>>(m, "FileHandle", "An open file (see gdskit.File).")
      .def(py::init([](const std::filesystem::path& path, const std::string& mode) {
             const open_spec spec = parse_mode(mode);
             auto f = std::make_shared<file_object>();
             if (spec.mode == gdskit::open_mode::read) {
               f->handle = std::make_shared<const gdskit::file_handle>(st::open_file(path));  // cannot hang on a FIFO
             } else {
               refuse_special(path);
               f->handle = std::make_shared<const gdskit::file_handle>(path, spec.mode, spec.options);
             }
             return f;
           }),
           py::arg("path"), py::arg("mode") = "r")
      .def("read", &file_object::transfer<false>, py::arg("ptr"), py::arg("nbytes"), py::arg("offset"),
           py::arg("device"), "Reads up to nbytes at offset into memory at ptr (device -1: host); returns the bytes read.")
      .def("write", &file_object::transfer<true>, py::arg("ptr"), py::arg("nbytes"), py::arg("offset"),
           py::arg("device"), "Writes nbytes from memory at ptr (device -1: host) at offset; returns nbytes.")
      .def("write_gather", &file_object::write_gather, py::arg("ranges"),
           "Writes every (ptr, nbytes, offset, device) range as one transfer (memory of one kind and device, no "
           "overlaps); returns the bytes written.")
      .def("plan", [](const file_object& f, int device) { return plan_tuple(*f.get(), device); }, py::arg("device"))
      .def("size", [](const file_object& f) { return f.get()->size(); })
      .def("reserve", [](const file_object& f, std::uint64_t nbytes) {
             py::gil_scoped_release unlocked;
             return f.get()->reserve(nbytes);
           }, py::arg("nbytes"),
           "Reserves disk space for the first nbytes and makes the file at least that long (fallocate); False "
           "where the file system cannot reserve space (the size is set all the same).")
      .def("header", [](const file_object& f) { return header_tuple(st::read_header(*f.get())); },
           "The validated safetensors header of this file, as gdskit.header() gives it.")
      .def("close", [](file_object& f) { f.handle.reset(); })
      .def_property_readonly("closed", [](const file_object& f) { return !f.handle; });
  // ---- end of gdskit.File ----

  m.def("check_device", &check_device, py::arg("device"),
        "Raises OSError(ENODEV) with the reason when CUDA device `device` (>= 0) cannot be used: no usable GPU, "
        "or no such device. -1 (host memory) always passes.");

  m.def("gpu_available", [] {
    std::string why;
    bool ok = gdskit::gpu_available(&why);
    return py::make_tuple(ok, why);
  });
}

}  // namespace gdskit::python
