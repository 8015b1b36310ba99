// The one translation of gdskit::error into Python exceptions, for every function of the module.
//
//   errno EBADMSG (a malformed file)    -> gdskit.SafetensorError: an OSError and a ValueError
//   errno EINVAL (input gdskit refuses) -> gdskit.InvalidArgumentError: an OSError and a ValueError
//   any other errno                     -> OSError(errno, ...): Python picks the subclass (FileNotFoundError,
//                                          IsADirectoryError, PermissionError, FileExistsError, ...)
//   cuFile and CUDA codes (not errno)   -> OSError(EIO, ...) whose message names the code
//
// The message is gdskit's ("pread at 4096+1048576: Input/output error") without the path, which Python adds
// once as the filename: str(e) is "[Errno 5] pread at 4096+1048576: Input/output error: 'model.safetensors'".
#include <cerrno>
#include <string>

#include "bindings.hpp"
#include "common/printable.hpp"
#include "gdskit/error.hpp"

namespace gdskit::python {
namespace {

py::handle safetensor_error;
py::handle invalid_argument_error;

// A new exception type deriving from OSError and ValueError, added to the module.
py::handle os_and_value_error(py::module_& m, const char* name, const char* doc) {
  py::tuple bases = py::make_tuple(py::handle(PyExc_OSError), py::handle(PyExc_ValueError));
  const std::string qualified = std::string("gdskit.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

// gdskit's message with the quoted path taken out (it comes first, after the operation).
std::string message_without_path(const gdskit::error& e) {
  std::string what = e.what();
  if (e.path().empty()) return what;
  // As format_what() quotes it: escaped, so a path with a newline or a quote is found too.
  const std::string token = " \"" + gdskit::printable(e.path()) + "\"";
  const auto at = what.find(token);
  if (at != std::string::npos) what.erase(at, token.size());
  return what;
}

// Sets the Python error for an errno, a message and a path (none when empty).
void set_os_error(int code, const std::string& message, const std::string& path) {
  PyObject* type = code == EBADMSG  ? safetensor_error.ptr()
                   : code == EINVAL ? invalid_argument_error.ptr()
                                    : PyExc_OSError;
  // Two statements, not ?:: newer pybind11 gives each make_tuple its own typed tuple class.
  py::object args = py::make_tuple(code, message);
  if (!path.empty()) args = py::make_tuple(code, message, path);
  PyErr_SetObject(type, args.ptr());
}

}  // namespace

void raise_os_error(int code, const std::string& message, const std::string& path) {
  set_os_error(code, message, path);
  throw py::error_already_set();
}

void raise_no_gpu(int device, const std::string& why) {
  raise_os_error(ENODEV, "cuda:" + std::to_string(device) + ": no usable GPU (" + why + ")", "");
}

void register_errors(py::module_& m) {
  safetensor_error = os_and_value_error(m, "SafetensorError",
                                        "A malformed safetensors file or index: an OSError with errno EBADMSG and "
                                        "a ValueError (as the safetensors library's own error is raised for it).");
  invalid_argument_error = os_and_value_error(
      m, "InvalidArgumentError",
      "Input gdskit refuses (errno EINVAL): an argument, setting or tensor that cannot be used as given. Both an "
      "OSError with errno EINVAL and a ValueError, wherever it is raised (a load, a save, a file).");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gdskit::error& e) {
      const int code = e.code().category() == std::generic_category() ? e.code().value() : EIO;
      set_os_error(code, message_without_path(e), e.path());
    }
  });
}

}  // namespace gdskit::python
