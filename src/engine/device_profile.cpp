#include "engine/device_profile.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string_view>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_bounded.hpp"
#include "common/json_text.hpp"
#include "common/printable.hpp"
#include "gdskit/error.hpp"
#include "gdskit/settings.hpp"
#include "engine/planner.hpp"
#include "posix/atomic_publish.hpp"
#include "posix/in_root.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::engine {
namespace {

// A sysfs attribute as one printable line: trimmed, control characters dropped, at most 128 characters (these
// strings end up in file names' hashes, JSON and terminals).
std::string sysfs_attr(const posix::root_files& root, const std::string& rel) {
  const std::string text = root.read(rel, 4096).text.value_or("");
  std::string out;
  for (char c : std::string_view(text).substr(0, text.find('\n'))) {
    if (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f) out += c;
    if (out.size() >= 128) break;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  while (!out.empty() && out.front() == ' ') out.erase(out.begin());
  return out;
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

const char* dir_name(io_dir d) { return d == io_dir::read ? "read" : "write"; }

nlohmann::json shape_json(const io_shape& s, double gib) {
  return {{"depth", s.depth}, {"request_bytes", s.request_bytes}, {"gib_per_s", gib}};
}

// Checks one {"depth", "request_bytes"} object; returns why it is unusable, or "".
std::string read_shape(const nlohmann::json& j, const char* what, io_shape& out, double& gib) {
  if (!j.is_object()) return fmt::format("\"{}\" missing", what);
  auto d = j.find("depth");
  auto r = j.find("request_bytes");
  if (d == j.end() || !d->is_number_unsigned() || r == j.end() || !r->is_number_unsigned()) {
    return fmt::format("\"{}\" needs whole-number depth and request_bytes", what);
  }
  const auto depth = d->get<std::uint64_t>();
  const auto req = r->get<std::uint64_t>();
  if (depth < 1 || depth > 1024) return fmt::format("{} depth {} outside 1..1024", what, depth);
  if (req < 4096 || req > (std::uint64_t{1} << 30) || req % 4096 != 0) {
    return fmt::format("{} request_bytes {} is not a multiple of 4096 in 4 KiB..1 GiB", what, req);
  }
  out.depth = static_cast<unsigned>(depth);
  out.request_bytes = static_cast<std::size_t>(req);
  auto g = j.find("gib_per_s");
  gib = (g != j.end() && g->is_number() && g->get<double>() >= 0) ? g->get<double>() : 0;
  return {};
}

}  // namespace

device_identity identify_device(const std::filesystem::path& root_dir, dev_t dev) {
  device_identity id;
  if (major(dev) == 0) {
    id.key = fmt::format("dev={}:{}", major(dev), minor(dev));
    return id;
  }
  // A root other than / is a captured one: every read resolves inside it.
  const posix::root_files root(root_dir);
  id.block = whole_disk_of(root, dev);
  if (!id.block.empty()) {
    const std::string b = "sys/block/" + id.block;
    std::string wwid = sysfs_attr(root, b + "/wwid");
    if (wwid.empty()) wwid = sysfs_attr(root, b + "/device/wwid");
    if (!wwid.empty()) {
      id.key = "wwid=" + wwid;
      return id;
    }
    const std::string model = sysfs_attr(root, b + "/device/model");
    const std::string serial = sysfs_attr(root, b + "/device/serial");
    if (!model.empty() && !serial.empty()) {
      id.key = fmt::format("model={} serial={}", model, serial);
      return id;
    }
  }
  // No stable name (virtio without a serial, loop devices): the number is the best there is.
  id.key = fmt::format("dev={}:{}", major(dev), minor(dev));
  if (!id.block.empty()) id.key += " " + id.block;
  return id;
}

std::filesystem::path profile_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::filesystem::path(xdg) / "gdskit";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::filesystem::path(home) / ".cache" / "gdskit";
  return {};
}

namespace {

// "<kind>-<block>-<hash of the identity>.json": the block name for people, the hash for uniqueness.
std::filesystem::path profile_file(const std::filesystem::path& dir, std::string_view kind, const device_identity& id) {
  std::string name = id.block.empty() ? std::string("dev") : id.block;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return dir / fmt::format("{}-{}-{:016x}.json", kind, name, fnv1a(id.key));
}

constexpr const char* k_no_profile_folder = "no profile folder (neither XDG_CACHE_HOME nor HOME is set)";

// What this process keeps of `dev`'s files in the profile folder: `cache`'s entry, made by `make(folder)` the
// first time (an empty folder: none is set). Kept by folder too: a process that points XDG_CACHE_HOME elsewhere
// reads that folder's files. Call with the cache's lock held.
template <class Entry, class Make>
Entry& entry_per_folder(std::map<std::pair<std::string, dev_t>, Entry>& cache, dev_t dev, Make make) {
  const auto dir = profile_dir();
  std::pair<std::string, dev_t> key{dir.string(), dev};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  return cache.emplace(std::move(key), make(dir)).first->second;
}

// Writes a profile's text atomically (temp file + rename) as `file` inside `dir` (created).
std::filesystem::path write_profile_file(const std::filesystem::path& dir, const std::filesystem::path& file,
                                         const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error(ec, "create folder", dir.string(), -1, 0);
  posix::atomic_write_file(file, text, 0644, /*overwrite=*/true);
  return file;
}

}  // namespace

std::filesystem::path profile_path(const std::filesystem::path& dir, const device_identity& id) {
  return profile_file(dir, "profile", id);
}

namespace {

// The text of a profile file (tuned or learned), or nothing with `why` set ("" when there is no file). Never
// throws. A profile sizes threads and pinned memory, so only a file this user controls counts.
std::optional<std::string> read_profile_text(const std::filesystem::path& file, std::string& why) {
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0) {
    why = errno == ENOENT ? "" : fmt::format("unreadable: {}", std::strerror(errno));
    return std::nullopt;
  }
  if (S_ISLNK(st.st_mode)) {
    why = "ignored: a symbolic link";
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    why = "ignored: not a regular file";
    return std::nullopt;
  }
  if (static_cast<std::size_t>(st.st_size) > k_profile_max_bytes) {
    why = fmt::format("ignored: {} bytes, more than {}", st.st_size, k_profile_max_bytes);
    return std::nullopt;
  }
  std::error_code ec;
  // O_NOFOLLOW and O_NONBLOCK: the file may be swapped for a link or a FIFO after the lstat.
  posix::unique_fd fd(posix::open_retry(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0, ec));
  if (!fd) {
    why = "ignored: " + ec.message();
    return std::nullopt;
  }
  struct stat fst {};
  if (posix::sys().fstat(fd.get(), &fst) != 0 || !S_ISREG(fst.st_mode) ||
      static_cast<std::size_t>(fst.st_size) > k_profile_max_bytes) {
    why = "ignored: not a small regular file";
    return std::nullopt;
  }
  // Checked on the open file, so a swap after the checks above cannot slip another user's file in.
  if (fst.st_uid != ::geteuid()) {
    why = fmt::format("ignored: owned by uid {}, not by this user (uid {})", fst.st_uid, ::geteuid());
    return std::nullopt;
  }
  if ((fst.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    why = fmt::format("ignored: writable by {} (mode {:04o}; chmod go-w to use it)",
                      (fst.st_mode & S_IWOTH) != 0 ? "others" : "its group", fst.st_mode & 07777);
    return std::nullopt;
  }
  std::string text(static_cast<std::size_t>(fst.st_size), '\0');
  const std::size_t got = posix::pread_full(fd.get(), text.data(), text.size(), 0, ec);
  if (ec) {
    why = "ignored: " + ec.message();
    return std::nullopt;
  }
  text.resize(got);
  return text;
}

// The JSON object of a profile's text made for `id` (tuned or learned: both carry "version" and "device"), or
// nothing with `why` set. Nesting is bounded while parsing, so nothing later walks a deep value. Never throws.
std::optional<nlohmann::json> check_profile_text(std::string_view text, const device_identity& id, int version,
                                                 std::string& why) {
  std::string parse_why;
  std::optional<nlohmann::json> j;
  try {
    j = parse_json_bounded<nlohmann::json>(text, k_profile_max_json_depth, parse_why);
  } catch (const std::bad_alloc&) {
    parse_why = "out of memory";
  }
  if (!j || !j->is_object()) {
    // The parser's own message may quote bytes of the file; only the depth is worth naming.
    const bool deep = parse_why.find("nested more than") != std::string::npos;
    why = deep ? "ignored: JSON " + parse_why : "ignored: not valid JSON";
    return std::nullopt;
  }
  auto v = j->find("version");
  if (v == j->end() || !v->is_number_integer() || v->get<std::int64_t>() != version) {
    why = fmt::format("ignored: version is not {}", version);
    return std::nullopt;
  }
  auto dev = j->find("device");
  if (dev == j->end() || !dev->is_object() || !dev->contains("key") || !(*dev)["key"].is_string() ||
      (*dev)["key"].get<std::string>() != id.key) {
    why = "ignored: made for another device";
    return std::nullopt;
  }
  return j;
}

nlohmann::json device_json(const device_identity& id) { return {{"key", id.key}, {"block", id.block}}; }

}  // namespace

io_shape clamp_to_limits(io_shape shape, const adaptive_limits& limits, std::string& note) {
  note.clear();
  const io_shape in = shape;
  shape.depth = std::clamp(shape.depth, limits.min_depth, std::max(limits.min_depth, limits.max_depth));
  shape.request_bytes = std::clamp(shape.request_bytes, limits.min_request_bytes,
                                   std::max(limits.min_request_bytes, limits.max_request_bytes));
  if (shape.depth != in.depth) note = fmt::format("depth {} held to {}", in.depth, shape.depth);
  if (shape.request_bytes != in.request_bytes) {
    note += fmt::format("{}{} held to {}", note.empty() ? "" : ", ", format_size(in.request_bytes),
                        format_size(shape.request_bytes));
  }
  return shape;
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm {};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

// `parse` of the text of `file`; without a usable file, a Result whose reason is `absent` (there is no file) or
// `kind` and why the file is not used.
template <typename Result, typename Parse>
Result load_text(const std::filesystem::path& file, std::string_view absent, std::string_view kind, Parse&& parse) {
  std::string why;
  if (const auto text = read_profile_text(file, why)) return parse(*text);
  Result out;
  out.reason = why.empty() ? std::string(absent) : fmt::format("{} {}", kind, why);
  return out;
}

}  // namespace

profile_result load_profile(const std::filesystem::path& file, const device_identity& id) {
  return load_text<profile_result>(file, "no profile (run gdskit tune)", "profile",
                                   [&](std::string_view text) { return parse_profile(text, id); });
}

profile_result parse_profile(std::string_view text, const device_identity& id) {
  profile_result out;
  std::string why;
  const auto j = check_profile_text(text, id, device_profile::k_version, why);
  if (!j) {
    out.reason = "profile " + why;
    return out;
  }
  device_profile p;
  p.device = id;
  if (auto c = j->find("created"); c != j->end() && c->is_string()) p.created = c->get<std::string>().substr(0, 40);
  // By reference: nothing of the file's value is copied or walked beyond what a shape needs.
  static const nlohmann::json none;
  auto member = [&](const char* key) -> const nlohmann::json& {
    auto it = j->find(key);
    return it == j->end() ? none : *it;
  };
  why = read_shape(member("read"), "read", p.read, p.read_gib_per_s);
  if (why.empty()) why = read_shape(member("write"), "write", p.write, p.write_gib_per_s);
  if (!why.empty()) {
    out.reason = "profile ignored: " + why;
    return out;
  }
  out.profile = std::move(p);
  return out;
}

std::string profile_json(const device_profile& p) {
  nlohmann::json j;
  j["version"] = device_profile::k_version;
  j["device"] = device_json(p.device);
  j["created"] = p.created;
  j["read"] = shape_json(p.read, p.read_gib_per_s);
  j["write"] = shape_json(p.write, p.write_gib_per_s);
  nlohmann::json sweep = nlohmann::json::array();
  for (const auto& pt : p.sweep) {
    auto e = shape_json(pt.shape, pt.gib_per_s);
    e["dir"] = dir_name(pt.dir);
    sweep.push_back(std::move(e));
  }
  j["sweep"] = std::move(sweep);
  return json_text(j, 2) + "\n";
}

std::filesystem::path save_profile(const std::filesystem::path& dir, const device_profile& p) {
  return write_profile_file(dir, profile_path(dir, p.device), profile_json(p));
}

const profile_result& profile_for_device(dev_t dev) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, dev_t>, profile_result> cache;
  std::lock_guard lock(mutex);
  return entry_per_folder(cache, dev, [dev](const std::filesystem::path& dir) {
    profile_result r;
    const device_identity id = identify_device("/", dev);
    if (dir.empty()) {
      r.reason = k_no_profile_folder;
    } else {
      r = load_profile(profile_path(dir, id), id);
    }
    return r;
  });
}

// ---- Learned profiles ----

std::filesystem::path learned_path(const std::filesystem::path& dir, const device_identity& id) {
  return profile_file(dir, "learned", id);
}

std::string learned_key(io_dir dir, bool staged) {
  return fmt::format("{}-{}", staged ? "staged" : "host", dir_name(dir));
}

learned_result load_learned(const std::filesystem::path& file, const device_identity& id) {
  return load_text<learned_result>(file, "nothing learned yet", "learned profile",
                                   [&](std::string_view text) { return parse_learned(text, id); });
}

learned_result parse_learned(std::string_view text, const device_identity& id) {
  learned_result out;
  std::string why;
  const auto j = check_profile_text(text, id, learned_profile::k_version, why);
  if (!j) {
    out.reason = "learned profile " + why;
    return out;
  }
  auto shapes = j->find("shapes");
  if (shapes == j->end() || !shapes->is_object()) {
    out.reason = "learned profile ignored: \"shapes\" missing";
    return out;
  }
  learned_profile p;
  p.device = id;
  for (const auto& [key, value] : shapes->items()) {
    // Only the four keys this library writes; anything else is someone else's and is dropped.
    bool known = false;
    for (bool staged : {false, true}) {
      for (io_dir d : {io_dir::read, io_dir::write}) known = known || key == learned_key(d, staged);
    }
    if (!known) continue;
    learned_shape ls;
    why = read_shape(value, key.c_str(), ls.shape, ls.gib_per_s);
    if (!why.empty()) {
      out.reason = "learned profile ignored: " + why;
      return out;
    }
    if (!(ls.gib_per_s > 0 && ls.gib_per_s < 1e4)) {
      out.reason = fmt::format("learned profile ignored: {} has no plausible gib_per_s", key);
      return out;
    }
    if (value.contains("updated") && value["updated"].is_string()) {
      // Shown by doctor: only a timestamp's characters pass.
      const std::string u = value["updated"].get<std::string>().substr(0, 40);
      if (u.find_first_not_of("0123456789-:TZ") == std::string::npos) ls.updated = u;
    }
    p.shapes.emplace(key, std::move(ls));
  }
  out.learned = std::move(p);
  return out;
}

std::string learned_json(const learned_profile& p) {
  nlohmann::json j;
  j["version"] = learned_profile::k_version;
  j["device"] = device_json(p.device);
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [key, ls] : p.shapes) {
    auto e = shape_json(ls.shape, ls.gib_per_s);
    e["updated"] = ls.updated;
    shapes[key] = std::move(e);
  }
  j["shapes"] = std::move(shapes);
  return json_text(j, 2) + "\n";
}

std::filesystem::path save_learned(const std::filesystem::path& dir, const learned_profile& p) {
  return write_profile_file(dir, learned_path(dir, p.device), learned_json(p));
}

namespace {

struct learned_cache_entry {
  device_identity id;
  learned_result result;
};

std::mutex learned_mutex;

// The learned profile of `dev` as this process knows it: read once from the profile folder, then kept up to
// date by remember_learned(). Called with learned_mutex held.
learned_cache_entry& learned_entry(dev_t dev) {
  static std::map<std::pair<std::string, dev_t>, learned_cache_entry> cache;
  return entry_per_folder(cache, dev, [dev](const std::filesystem::path& dir) {
    learned_cache_entry e;
    e.id = identify_device("/", dev);
    if (dir.empty()) {
      e.result.reason = k_no_profile_folder;
    } else {
      e.result = load_learned(learned_path(dir, e.id), e.id);
    }
    return e;
  });
}

}  // namespace

std::optional<learned_shape> learned_for_device(dev_t dev, const std::string& key, std::string* device_name) {
  std::lock_guard lock(learned_mutex);
  const learned_cache_entry& e = learned_entry(dev);
  if (!e.result.learned) return std::nullopt;
  auto it = e.result.learned->shapes.find(key);
  if (it == e.result.learned->shapes.end()) return std::nullopt;
  if (device_name != nullptr) *device_name = e.id.block.empty() ? e.id.key : e.id.block;
  return it->second;
}

learned_result learned_profile_for_device(dev_t dev) {
  std::lock_guard lock(learned_mutex);
  return learned_entry(dev).result;
}

namespace {

// What remember_learned() wrote and no command has said yet (take_learned_writes()), bounded.
std::mutex writes_mutex;
std::vector<learned_write> unsaid_writes;
constexpr std::size_t k_unsaid_max = 64;

void note_write(const device_identity& id, const std::string& key, const io_shape& shape) {
  std::lock_guard lock(writes_mutex);
  if (unsaid_writes.size() >= k_unsaid_max) unsaid_writes.erase(unsaid_writes.begin());
  unsaid_writes.push_back({id.block.empty() ? id.key : id.block, key, shape});
}

}  // namespace

std::vector<learned_write> take_learned_writes() noexcept {
  std::lock_guard lock(writes_mutex);
  return std::exchange(unsaid_writes, {});
}

std::string learned_notice(const std::vector<learned_write>& writes) {
  // One line, however many shapes: grouped by device in the order they were written; a key written twice
  // shows its last shape.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, io_shape>>>> by_device;
  for (const auto& w : writes) {
    auto d = std::find_if(by_device.begin(), by_device.end(), [&](const auto& e) { return e.first == w.device; });
    if (d == by_device.end()) d = by_device.insert(by_device.end(), {w.device, {}});
    auto k = std::find_if(d->second.begin(), d->second.end(), [&](const auto& e) { return e.first == w.key; });
    if (k == d->second.end()) {
      d->second.emplace_back(w.key, w.shape);
    } else {
      k->second = w.shape;
    }
  }
  std::string out;
  for (const auto& [device, shapes] : by_device) {
    std::string what;
    for (const auto& [key, shape] : shapes) {
      std::string name = key;  // "host-read" -> "host reads"
      if (auto dash = name.find('-'); dash != std::string::npos) name[dash] = ' ';
      what += fmt::format("{}{}s depth {} x {}", what.empty() ? "" : ", ", name, shape.depth,
                          format_size(shape.request_bytes));
    }
    const std::string dev = printable(device);
    // Quoted for the shell unless every character is one the shell takes as it is (an identity key may hold
    // anything a device reports).
    std::string arg = dev;
    const bool plain = !dev.empty() && std::all_of(dev.begin(), dev.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0 || std::string_view("_.:=+,@%/-").find(c) != std::string_view::npos;
    });
    if (!plain) {
      arg = "'";
      for (char c : dev) arg += c == '\'' ? std::string("'\\''") : std::string(1, c);
      arg += "'";
    }
    out += fmt::format("{}{} on {} (gdskit tune --forget {} drops it)", out.empty() ? "learned: " : "; ", what, dev,
                       arg);
  }
  return out;
}

std::string take_learned_notice() { return learned_notice(take_learned_writes()); }

namespace {

// The device a profile file names, escaped for the terminal: its "device" object, else empty.
device_identity file_identity(std::string_view text) {
  device_identity id;
  std::string why;
  std::optional<nlohmann::json> j;
  try {
    j = parse_json_bounded<nlohmann::json>(text, k_profile_max_json_depth, why);
  } catch (...) {
    return id;
  }
  if (!j || !j->is_object()) return id;
  auto dev = j->find("device");
  if (dev == j->end() || !dev->is_object()) return id;
  auto text_of = [&](const char* name) {
    auto v = dev->find(name);
    return v != dev->end() && v->is_string() ? v->get<std::string>() : std::string();
  };
  id.key = text_of("key");
  id.block = text_of("block");
  return id;
}

}  // namespace

std::vector<stored_profile> list_profiles(const std::filesystem::path& dir) {
  std::vector<stored_profile> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool learned = name.starts_with("learned-");
    if (!(learned || name.starts_with("profile-")) || !name.ends_with(".json")) continue;
    stored_profile p;
    p.file = it->path();
    p.learned = learned;
    std::string why;
    const auto text = read_profile_text(p.file, why);
    if (!text) {
      p.reason = (learned ? "learned profile " : "profile ") + (why.empty() ? std::string("gone") : why);
      out.push_back(std::move(p));
      continue;
    }
    // Checked against the device the file names: whether that device is in this machine is not asked.
    const device_identity id = file_identity(*text);
    if (learned) {
      learned_result r = parse_learned(*text, id);
      p.shapes = std::move(r.learned);
      p.reason = std::move(r.reason);
    } else {
      profile_result r = parse_profile(*text, id);
      p.tuned = std::move(r.profile);
      p.reason = std::move(r.reason);
    }
    p.device = {printable(id.block.substr(0, 128)), printable(id.key.substr(0, 256))};
    out.push_back(std::move(p));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.file < b.file; });
  return out;
}

bool remember_learned(dev_t dev, const std::string& key, learned_shape shape) noexcept {
  try {
    std::lock_guard lock(learned_mutex);
    learned_cache_entry& e = learned_entry(dev);
    const auto dir = profile_dir();
    if (dir.empty()) return false;
    // Merge with what other processes wrote since: the file's other shapes are theirs to keep.
    learned_result now = load_learned(learned_path(dir, e.id), e.id);
    learned_profile p = now.learned ? std::move(*now.learned) : learned_profile{};
    p.device = e.id;
    if (shape.updated.empty()) shape.updated = utc_now_iso();
    p.shapes[key] = shape;
    save_learned(dir, p);
    note_write(e.id, key, shape.shape);
    if (!e.result.learned) e.result.learned = learned_profile{e.id, {}};
    e.result.learned->shapes[key] = std::move(shape);
    e.result.reason.clear();
    return true;
  } catch (...) {
    return false;  // a read-only or full cache folder costs the next process its head start, nothing more
  }
}

}  // namespace gdskit::engine
