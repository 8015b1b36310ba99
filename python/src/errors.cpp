// Exceptions: gdskit::error becomes OSError(errno, message, path).
#include <cerrno>

#include "bindings.hpp"
#include "gdskit/error.hpp"

namespace gdskit::python {

void register_errors(py::module_& m) {
  // gdskit::error becomes OSError(errno, message, path): Python picks the subclass from the errno
  // (FileNotFoundError, IsADirectoryError, PermissionError, ...). A malformed file (EBADMSG) is SafetensorError,
  // which is both a ValueError (as in the safetensors library) and an OSError with that errno. CUDA and cuFile
  // codes, which are not errno values, become OSError(EIO) with the message naming the code.
  static py::handle safetensor_error;
  {
    py::tuple bases = py::make_tuple(py::handle(PyExc_OSError), py::handle(PyExc_ValueError));
    PyObject* type = PyErr_NewExceptionWithDoc("gdskit.SafetensorError",
                                               "A malformed safetensors file or index (errno EBADMSG).",
                                               bases.ptr(), nullptr);
    if (type == nullptr) throw py::error_already_set();
    safetensor_error = type;
    m.add_object("SafetensorError", py::handle(type));
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gdskit::error& e) {
      const int code = e.code().category() == std::generic_category() ? e.code().value() : EIO;
      // Two statements, not ?:: newer pybind11 gives each make_tuple its own typed tuple class.
      py::object args = py::make_tuple(code, e.what());
      if (!e.path().empty()) args = py::make_tuple(code, e.what(), e.path());
      PyErr_SetObject(code == EBADMSG ? safetensor_error.ptr() : PyExc_OSError, args.ptr());
    }
  });
}

}  // namespace gdskit::python
