#include "tools/flag_errors.hpp"

#include <charconv>
#include <cmath>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace gdskit::tools {
namespace {

// "-o/--offset": every name the flag answers to, as --help lists them; a positional's own name.
std::string names_of(const CLI::Option& o) {
  std::string out;
  for (const auto& s : o.get_snames()) out += (out.empty() ? "-" : "/-") + s;
  for (const auto& l : o.get_lnames()) out += (out.empty() ? "--" : "/--") + l;
  return out.empty() ? o.get_name(true) : out;
}

// The flag of `cmd`, or of a command above it, whose parser name (Option::get_name, which the parser's errors
// begin with) starts `text` and is followed by `after`.
const CLI::Option* named_in(const CLI::App& cmd, std::string_view text, std::string_view after) {
  for (const CLI::App* app = &cmd; app != nullptr; app = app->get_parent()) {
    for (const CLI::Option* o : app->get_options()) {
      const std::string name = o->get_name();
      if (!name.empty() && text.starts_with(name) && text.substr(name.size()).starts_with(after)) return o;
    }
  }
  return nullptr;
}

// What a flag of the parser's own type names takes, in words; the type name the command gave it otherwise.
std::string takes(const CLI::Option& o) {
  const std::string type = o.get_type_name();
  if (type == "INT" || type == "UINT") return "a whole number";
  if (type == "FLOAT") return "a number";
  if (type == "TEXT" || type.empty()) return "";
  return type;
}

std::string joined(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : std::string(sep)) + item;
  return out;
}

}  // namespace

std::string usage_message(const CLI::App& cmd, const CLI::ParseError& e) {
  const std::string_view what = e.what();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    const CLI::Option* o = named_in(cmd, what, ": ");
    if (o == nullptr) return std::string(what);
    const auto& given = o->results();
    if (given.size() > 1) {
      const std::string times = given.size() == 2 ? "twice" : fmt::format("{} times", given.size());
      return fmt::format("{} given {} ({}); it takes one value", names_of(*o), times, joined(given, ", "));
    }
    const std::string value = takes(*o);
    return fmt::format("{} needs a value{}", names_of(*o), value.empty() ? "" : ": " + value);
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    constexpr std::string_view lead = "Could not convert: ";
    const CLI::Option* o = what.starts_with(lead) ? named_in(cmd, what.substr(lead.size()), " = ") : nullptr;
    if (o == nullptr) return std::string(what);
    const std::string value = takes(*o);
    return fmt::format("{}: '{}' is not {}", names_of(*o), joined(o->results(), " "),
                       value.empty() ? "a value it takes" : value);
  }
  if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    // The validators' words are gdskit's already: only the flag is named as --help names it.
    if (const CLI::Option* o = named_in(cmd, what, ": ")) {
      return names_of(*o) + std::string(what.substr(o->get_name().size()));
    }
  }
  return std::string(what);
}

CLI::Validator whole_number(std::int64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        std::string_view t = text;
        const bool negative = t.starts_with('-');
        if (negative || t.starts_with('+')) t.remove_prefix(1);
        std::uint64_t magnitude = 0;
        const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), magnitude);
        const bool digits = !t.empty() && t.find_first_not_of("0123456789") == std::string_view::npos;
        if (!digits) return fmt::format("'{}' is not a whole number", text);
        bool in_range = ec == std::errc() && end == t.data() + t.size();
        if (in_range && negative) {
          // -magnitude >= lo, without forming -2^63 as a positive number ("-0" is 0: in range only where 0 is).
          in_range = magnitude == 0 ? lo <= 0 : lo < 0 && magnitude - 1 <= static_cast<std::uint64_t>(-(lo + 1));
        } else if (in_range) {
          in_range = magnitude <= hi && (lo <= 0 || magnitude >= static_cast<std::uint64_t>(lo));
        }
        if (!in_range) return fmt::format("'{}' is out of range ({} .. {})", text, lo, hi);
        // Plain decimal for the parser's own conversion, which would read "010" as octal.
        text = (negative && magnitude != 0 ? "-" : "") + std::to_string(magnitude);
        return {};
      },
      "");
}

CLI::Validator real_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
          return fmt::format("'{}' is not a number", text);
        }
        return {};
      },
      "");
}

CLI::Validator one_of(std::vector<std::string> names) {
  // The description --help shows after the type, as the parser's own set check shows it: TEXT:{default,off}.
  const std::string shown = "{" + joined(names, ",") + "}";
  return CLI::Validator(
      [names = std::move(names)](std::string& text) -> std::string {
        for (const auto& n : names) {
          if (text == n) return {};
        }
        return fmt::format("'{}' is not one of {}", text, joined(names, ", "));
      },
      shown);
}

}  // namespace gdskit::tools
