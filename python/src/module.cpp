// gdskit._gdskit: the compiled half of the Python package. Tensors leave as DLPack (legacy "dltensor"
// capsules and objects with __dlpack__), so there is no build dependency on torch or numpy. Each area of the
// module lives in its own file (see bindings.hpp); this one puts them together.
#include "bindings.hpp"
#include "file_object.hpp"

void add_kv_bindings(pybind11::module_& m);  // kv_bindings.cpp: gdskit.kv

PYBIND11_MODULE(_gdskit, m) {
  namespace gp = gdskit::python;
  m.doc() = "gdskit: storage <-> GPU memory transfers (compiled part; use the gdskit package)";
  m.attr("__version__") = GDSKIT_VERSION_TEXT;
  gp::register_errors(m);
  gp::register_dtypes(m);
  gp::register_dlpack(m);
  gp::register_safetensors(m);
  gp::register_files(m);
  gp::register_save(m);
  gp::register_slices(m);
  gp::register_settings(m);
  gp::register_checkpoint(m);
  gdskit_python::register_batch(m);
  add_kv_bindings(m);
}
