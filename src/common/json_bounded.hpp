// Parsing JSON that came from outside (checkpoint indexes, device profiles): arrays and objects nested deeper
// than a stated limit are refused while parsing, so no later recursive walk of the value (dump, copy,
// comparison) can exhaust the stack, whatever the file holds.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace gdskit {

/// Nesting accepted in a checkpoint's index (*.safetensors.index.json). The format needs 2 ({"weight_map":
/// {name: file}}); writers that add structured metadata stay far below this.
inline constexpr std::size_t max_index_json_depth = 64;

/// The JSON value of `text` (`Json`: nlohmann::json or nlohmann::ordered_json), or nullopt with `why` set: a
/// syntax error, a number that does not fit a double, or arrays and objects nested deeper than `max_depth`
/// (1 allows one object or array of plain values). Of duplicate keys the last wins, as in nlohmann's parser.
/// Time and memory are linear in the text; never throws on any text (only std::bad_alloc).
template <typename Json>
std::optional<Json> parse_json_bounded(std::string_view text, std::size_t max_depth, std::string& why);

namespace detail {

// Builds the value from SAX events, as nlohmann's own DOM parser does, but stops at the first container that
// would open deeper than the limit. nlohmann's parser itself keeps its state on the heap; the depth matters to
// what callers do with the value afterwards.
template <typename Json>
class bounded_dom final : public nlohmann::json_sax<Json> {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  bounded_dom(Json& root, std::size_t max_depth, std::string& why) : root_(root), max_depth_(max_depth), why_(why) {}

  bool null() override { return put(nullptr); }
  bool boolean(bool v) override { return put(v); }
  bool number_integer(number_integer_t v) override { return put(v); }
  bool number_unsigned(number_unsigned_t v) override { return put(v); }
  bool number_float(number_float_t v, const string_t& text) override {
    if (!std::isfinite(v)) return fail(fmt::format("number {} is out of range", text));
    return put(v);
  }
  bool string(string_t& v) override { return put(std::move(v)); }
  bool binary(binary_t&) override { return fail("binary value"); }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    member_ = &(*stack_.back())[k];
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(e.what());
  }

 private:
  template <typename V>
  Json* place(V&& v) {
    if (stack_.empty()) {
      root_ = Json(std::forward<V>(v));
      return &root_;
    }
    Json* parent = stack_.back();
    if (parent->is_array()) {
      parent->push_back(Json(std::forward<V>(v)));
      return &parent->back();
    }
    *member_ = Json(std::forward<V>(v));
    return member_;
  }
  template <typename V>
  bool put(V&& v) {
    place(std::forward<V>(v));
    return true;
  }
  bool open(Json&& empty) {
    if (stack_.size() >= max_depth_) {
      return fail(fmt::format("nested more than {} levels deep", max_depth_));
    }
    stack_.push_back(place(std::move(empty)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool fail(std::string what) {
    if (why_.empty()) why_ = std::move(what);
    return false;
  }

  Json& root_;
  const std::size_t max_depth_;
  std::string& why_;
  std::vector<Json*> stack_;  // open objects and arrays, outermost first
  Json* member_ = nullptr;    // the member of the innermost object whose key came last
};

}  // namespace detail

template <typename Json>
std::optional<Json> parse_json_bounded(std::string_view text, std::size_t max_depth, std::string& why) {
  why.clear();
  Json root;
  detail::bounded_dom<Json> dom(root, max_depth, why);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &dom, nlohmann::json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    // The SAX interface reports syntax errors through parse_error; anything thrown past it is still one.
    if (why.empty()) why = e.what();
    ok = false;
  }
  if (!ok) {
    if (why.empty()) why = "invalid JSON";
    return std::nullopt;
  }
  return root;
}

}  // namespace gdskit
