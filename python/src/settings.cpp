// gdskit.settings: the process-wide settings of the C++ core (include/gdskit/settings.hpp), read and changed by
// name; the facade is gdskit/_settings.py.
#include <string>

#include "bindings.hpp"
#include "engine/device_profile.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"

namespace gdskit::python {
namespace {

gdskit::setting_entry find(const std::string& name) {
  for (auto& e : gdskit::describe_settings()) {
    if (e.name == name) return e;
  }
  throw py::attribute_error("gdskit.settings has no setting \"" + name + "\"");
}

// A value as Python sees it: an int for counts and byte counts, a bool for on/off, a str for choices.
py::object typed(const gdskit::setting_entry& e) {
  switch (e.kind) {
    case gdskit::setting_kind::count: return py::int_(std::stoull(e.value));
    case gdskit::setting_kind::bytes: return py::int_(*gdskit::parse_size(e.value));
    case gdskit::setting_kind::on_off: return py::bool_(e.value == "on");
    default: return py::str(e.value);
  }
}

// A Python value as the setting's text: bool for on/off only, ints for numbers, str for anything.
std::string text_of(const gdskit::setting_entry& e, const py::object& value) {
  if (PyBool_Check(value.ptr())) {
    if (e.kind != gdskit::setting_kind::on_off) {
      throw py::type_error("gdskit.settings." + e.name + " takes " +
                           (e.kind == gdskit::setting_kind::choice ? "a str" : "an int") + ", not a bool");
    }
    return value.cast<bool>() ? "on" : "off";
  }
  if (PyLong_Check(value.ptr())) {
    if (e.kind == gdskit::setting_kind::choice) throw py::type_error("gdskit.settings." + e.name + " takes a str");
    return py::str(value).cast<std::string>();
  }
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  throw py::type_error("gdskit.settings." + e.name + ": expected " +
                       (e.kind == gdskit::setting_kind::on_off ? "a bool or \"on\"/\"off\"" : "an int or a str") +
                       ", not " + std::string(py::str(py::type::of(value).attr("__name__"))));
}

}  // namespace

void register_settings(py::module_& m) {
  py::class_<gdskit::settings_state>(m, "SettingsState", "Saved process-wide settings (values and sources).");
  m.def(
      "settings_describe",
      [] {
        py::list out;
        for (const auto& e : gdskit::describe_settings()) {
          py::dict d;
          d["name"] = e.name;
          d["value"] = typed(e);
          d["text"] = e.value;
          d["source"] = std::string(gdskit::to_string(e.source));
          d["variable"] = e.variable;
          d["help"] = e.help;
          d["note"] = e.note;
          out.append(d);
        }
        return out;
      },
      "Every setting: [{name, value, text, source ('default', 'environment' or 'code'), variable, help, note}].");
  m.def("settings_get", [](const std::string& name) { return typed(find(name)); }, py::arg("name"));
  m.def(
      "settings_set",
      [](const std::string& name, const py::object& value) {
        gdskit::set_setting(name, text_of(find(name), value));
      },
      py::arg("name"), py::arg("value"));
  m.def(
      "settings_reset",
      [](const std::string& name) {
        find(name);  // AttributeError for an unknown name, as settings_get
        gdskit::reset_setting(name);
      },
      py::arg("name"));
  m.def("settings_save", &gdskit::save_settings);
  m.def("settings_restore", &gdskit::restore_settings, py::arg("state"));
  m.def("take_learned_notice", &gdskit::engine::take_learned_notice,
        "The line that says which device shapes were learned (written to the profile folder) since the last "
        "call; empty when none were.");
}

}  // namespace gdskit::python
