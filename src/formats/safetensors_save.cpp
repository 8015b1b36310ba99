// Saving safetensors files and sharded checkpoints from host or GPU memory, published atomically.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <charconv>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <sys/stat.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/arith.hpp"
#include "common/json_bounded.hpp"
#include "formats/safetensors_open.hpp"
#include "gdskit/error.hpp"
#include "gdskit/file.hpp"
#include "gdskit/safetensors.hpp"
#include "posix/atomic_publish.hpp"
#include "posix/syscalls.hpp"

namespace gdskit::safetensors {
namespace {

[[noreturn]] void refuse(const std::string& what) { throw error(errno_code(EINVAL), "safetensors save: " + what); }

// The format's dtypes in the order of safetensors' own Dtype enum (increasing alignment), which its writer
// sorts by; our enum lists them in another order.
unsigned writer_rank(dtype t) noexcept {
  switch (t) {
    case dtype::BOOL: return 0;
    case dtype::F4: return 1;
    case dtype::F6_E2M3: return 2;
    case dtype::F6_E3M2: return 3;
    case dtype::U8: return 4;
    case dtype::I8: return 5;
    case dtype::F8_E5M2: return 6;
    case dtype::F8_E4M3: return 7;
    case dtype::F8_E8M0: return 8;
    case dtype::I16: return 11;
    case dtype::U16: return 12;
    case dtype::F16: return 13;
    case dtype::BF16: return 14;
    case dtype::I32: return 15;
    case dtype::U32: return 16;
    case dtype::F32: return 17;
    case dtype::C64: return 18;
    case dtype::F64: return 19;
    case dtype::I64: return 20;
    case dtype::U64: return 21;
  }
  return 0;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    for (std::size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr std::uint32_t min_of[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_of[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// A JSON string the way serde_json writes it: quote, backslash and control characters escaped (the short forms
// \b \t \n \f \r, else \u00xx in lower case), everything else (DEL and non-ASCII included) as is.
void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

std::uint64_t expected_nbytes(const save_tensor& t) {
  std::uint64_t numel = 1;
  for (auto d : t.shape) {
    if (d != 0 && numel > UINT64_MAX / d) refuse(fmt::format("tensor \"{}\": the shape overflows", printable_name(t.name)));
    numel *= d;
  }
  const unsigned bits = bits_of(t.dtype);
  if (numel > UINT64_MAX / bits) refuse(fmt::format("tensor \"{}\": the shape overflows", printable_name(t.name)));
  if (numel * bits % 8 != 0) {
    refuse(fmt::format("tensor \"{}\": {} elements of {} are not a whole number of bytes", printable_name(t.name), numel,
                        to_string(t.dtype)));
  }
  return numel * bits / 8;
}

void check_cancel(const file_handle& f, const save_options& o) {
  if (o.cancelled && o.cancelled()) {
    throw error(errno_code(ECANCELED), "safetensors save", f.path().string(), -1, 0, "cancelled");
  }
}

// The next view of a tensor that hands out its bytes piece by piece, checked.
buffer_view next_view(const save_tensor& t, std::uint64_t off) {
  const buffer_view v = t.source(off);
  if (v.data == nullptr || v.nbytes == 0 || v.nbytes > t.data.nbytes - off) {
    refuse(fmt::format("tensor \"{}\": its source returned {} bytes at offset {} of {}", printable_name(t.name),
                        v.nbytes, off, t.data.nbytes));
  }
  return v;
}

// Tensors that hand out their bytes view by view: one tensor, one view at a time.
void write_sourced(const file_handle& f, const std::vector<save_tensor>& tensors, const save_layout& layout,
                   const save_options& o, std::atomic<std::uint64_t>& done, std::uint64_t total, save_stats& stats) {
  for (std::size_t i : layout.order) {
    const auto& t = tensors[i];
    if (!t.source) continue;
    const std::uint64_t base = layout.header.size() + layout.begin_bytes[i];
    for (std::uint64_t off = 0; off < t.data.nbytes;) {
      check_cancel(f, o);
      const buffer_view v = next_view(t, off);
      f.write(v, v.nbytes, base + off);
      off += v.nbytes;
      ++stats.pieces;
      const std::uint64_t now = done.fetch_add(v.nbytes) + v.nbytes;
      if (o.progress) o.progress(now, total);
    }
  }
}

// Tensors in memory: every tensor of one memory (host, or one GPU) in one gathered write, so the file is written
// as one transfer at the depth the device wants however small its tensors are, and the joins between tensors
// fall inside aligned requests.
void write_gathered(const file_handle& f, const std::vector<save_tensor>& tensors, const save_layout& layout,
                    const save_options& o, std::atomic<std::uint64_t>& done, std::uint64_t total, save_stats& stats) {
  std::map<int, std::vector<write_extent>> by_memory;  // -1: host and pinned memory, else the GPU
  for (std::size_t i : layout.order) {
    const auto& t = tensors[i];
    if (t.source || t.data.nbytes == 0) continue;
    const bool host = t.data.kind == memory_kind::host || t.data.kind == memory_kind::pinned;
    by_memory[host ? -1 : t.data.device].push_back({t.data, layout.header.size() + layout.begin_bytes[i]});
  }
  gather_options g;
  g.cancelled = o.cancelled;
  g.progress = [&](std::size_t n) {
    const std::uint64_t now = done.fetch_add(n) + n;
    if (o.progress) o.progress(now, total);
  };
  for (const auto& [memory, extents] : by_memory) {
    check_cancel(f, o);
    f.write_gather(extents, g);
    stats.pieces += extents.size();
  }
}

// Writes one file's tensor data, then its header, then syncs it; the caller publishes.
void write_file(const file_handle& f, const std::vector<save_tensor>& tensors, const save_layout& layout,
                const save_options& o, std::atomic<std::uint64_t>& done, std::uint64_t total, save_stats& stats) {
  write_gathered(f, tensors, layout, o, done, total, stats);
  write_sourced(f, tensors, layout, o, done, total, stats);
  check_cancel(f, o);
  // The header goes last into the place reserved for it: a file cut short before this point has no valid header.
  f.pwrite(layout.header.data(), layout.header.size(), 0);
  const auto t_sync = std::chrono::steady_clock::now();
  f.sync();
  stats.sync_seconds += seconds_since(t_sync);
  stats.tensor_bytes += layout.data_nbytes;
  stats.file_bytes += layout.file_nbytes();
  ++stats.files;
}

void check_options(const save_options& o) {
  if (o.max_shard_bytes == 0) refuse("max_shard_bytes is 0");
}

// The temporary files of a save, each with the name the caller asked for.
using temp_names = std::vector<std::pair<std::string, std::filesystem::path>>;

// An error about a temporary file, said about the file the caller named: the temporary name means nothing to
// them. Other errors pass as they are.
[[noreturn]] void rethrow_for_target(const error& e, const temp_names& names) {
  for (const auto& [temp, target] : names) {
    if (e.path() != temp) continue;
    if (e.operation() == "rename") {
      throw error(e.code(), "rename", target.string(), -1, 0, "publishing the finished temporary file");
    }
    const std::string how = "through its temporary file";
    throw error(e.code(), e.operation(), target.string(), e.offset_bytes(), e.nbytes(),
                e.detail().empty() ? how : e.detail() + "; " + how);
  }
  throw e;
}

// One file in the making: its temporary name, its open handle and its layout.
struct pending_file {
  posix::atomic_publish publish;
  file_handle handle;
  save_layout layout;
  std::vector<save_tensor> tensors;
};

pending_file open_pending(const std::filesystem::path& path, std::vector<save_tensor> tensors,
                          const std::optional<metadata_entries>& metadata, const save_options& o, temp_names& names) {
  pending_file p;
  p.layout = plan_save(tensors, metadata);
  p.tensors = std::move(tensors);
  p.publish = posix::atomic_publish(path, o.overwrite);
  names.emplace_back(p.publish.temp_path().string(), path);
  // 0666 before the umask, as other programs create files.
  p.handle = file_handle(p.publish.temp_path(), open_mode::write, {.create = true, .exclusive = true, .permissions = 0666},
                         o.config);
  // The whole file's space is reserved first: a disk too full for it fails before any byte is written.
  p.handle.reserve(p.layout.file_nbytes());
  return p;
}

// Replacing shards one by one under an index that still names them would show a reader a mix of two
// checkpoints. So before the first rename, the shards of the existing index that are about to be replaced get a
// second name (a hard link, "<file>.gdskit-old"), and the existing index is republished pointing at those names:
// at every instant the index in the folder names a complete checkpoint, old or new. Returns the links, which
// the caller removes once the new index is published. The old index is text from outside: it is read as any
// index is (a regular file, bounded size and nesting), and one that cannot be read so is removed rather than
// left naming files that are about to change. A failure before the old index is republished removes the links
// made so far (the old index still names the original files).
std::vector<std::filesystem::path> protect_old_checkpoint(const std::filesystem::path& index,
                                                          const std::vector<std::filesystem::path>& targets) {
  std::vector<std::filesystem::path> links;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(index, ec)) return links;
  const auto folder = index.parent_path();
  std::optional<nlohmann::ordered_json> j;
  try {
    std::string why;
    j = parse_json_bounded<nlohmann::ordered_json>(formats::read_small_file(index, max_header_bytes),
                                                   max_index_json_depth, why);
  } catch (const error&) {
    j.reset();  // vanished, replaced by something that is not a regular file, or too large
  }
  if (!j || !j->is_object() || !j->contains("weight_map") || !(*j)["weight_map"].is_object()) {
    if (posix::sys().unlink(index.c_str()) != 0) throw error(errno_code(errno), "remove", index.string(), -1, 0);
    posix::sync_folder(folder);
    return links;
  }
  struct undo_links {
    std::vector<std::filesystem::path>& links;
    bool armed = true;
    ~undo_links() {
      if (!armed) return;
      for (const auto& l : links) posix::sys().unlink(l.c_str());
    }
  } undo{links};
  const std::set<std::filesystem::path> replaced(targets.begin(), targets.end());
  std::map<std::string, std::string> renamed;
  for (auto& [name, file] : (*j)["weight_map"].items()) {
    if (!file.is_string()) continue;
    const std::string f = file.get<std::string>();
    const auto p = folder / f;
    if (!replaced.contains(p) || !std::filesystem::exists(p, ec)) continue;
    auto it = renamed.find(f);
    if (it == renamed.end()) {
      const std::string alias = f + ".gdskit-old";
      const auto alias_path = folder / alias;
      posix::sys().unlink(alias_path.c_str());
      if (posix::sys().link(p.c_str(), alias_path.c_str()) != 0) {
        throw error(errno_code(errno), "link", p.string(), -1, 0, fmt::format("to {}", printable_name(alias_path.string())));
      }
      links.push_back(alias_path);
      it = renamed.emplace(f, alias).first;
    }
    file = it->second;
  }
  if (!links.empty()) {
    posix::atomic_write_file(index, j->dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n",
                             0644, true);
  }
  undo.armed = false;
  return links;
}

path_decision plan_for(const file_handle& f, const std::vector<save_tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.data.nbytes > 0 && !t.source) return f.plan(t.data);
  }
  return f.plan(buffer_view{});
}

}  // namespace

save_layout plan_save(const std::vector<save_tensor>& tensors, const std::optional<metadata_entries>& metadata) {
  save_layout l;
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name.empty()) refuse("a tensor has an empty name");
    if (t.name == "__metadata__") refuse("\"__metadata__\" is reserved and cannot name a tensor");
    if (!valid_utf8(t.name)) refuse("a tensor name is not valid UTF-8");
    const std::string shown = printable_name(t.name);  // names may come from a file (gdskit load --save)
    if (!names.insert(t.name).second) refuse(fmt::format("two tensors are called \"{}\"", shown));
    if (t.shape.size() > max_rank) refuse(fmt::format("tensor \"{}\" has more than {} dimensions", shown, max_rank));
    const std::uint64_t want = expected_nbytes(t);
    if (t.data.nbytes != want) {
      refuse(fmt::format("tensor \"{}\": {} {} of shape [{}] needs {} bytes, the buffer has {}", shown, want,
                          to_string(t.dtype), fmt::join(t.shape, ", "), want, t.data.nbytes));
    }
    if (want > 0 && t.data.data == nullptr && !t.source) refuse(fmt::format("tensor \"{}\" has no data pointer", shown));
  }
  if (metadata) {
    std::set<std::string_view> keys;
    for (const auto& [k, v] : *metadata) {
      if (!valid_utf8(k) || !valid_utf8(v)) refuse("a metadata key or value is not valid UTF-8");
      if (!keys.insert(k).second) refuse(fmt::format("metadata key \"{}\" given twice", printable_name(k)));
    }
  }
  l.order.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) l.order[i] = i;
  std::sort(l.order.begin(), l.order.end(), [&](std::size_t a, std::size_t b) {
    const unsigned ra = writer_rank(tensors[a].dtype), rb = writer_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });
  l.begin_bytes.assign(tensors.size(), 0);
  std::string json = "{";
  bool first = true;
  if (metadata) {
    json += "\"__metadata__\":{";
    for (std::size_t i = 0; i < metadata->size(); ++i) {
      if (i) json.push_back(',');
      append_json_string(json, (*metadata)[i].first);
      json.push_back(':');
      append_json_string(json, (*metadata)[i].second);
    }
    json += "}";
    first = false;
  }
  std::uint64_t offset = 0;
  for (std::size_t i : l.order) {
    const auto& t = tensors[i];
    if (!first) json.push_back(',');
    first = false;
    append_json_string(json, t.name);
    json += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", to_string(t.dtype),
                        fmt::join(t.shape, ","), offset, offset + t.data.nbytes);
    l.begin_bytes[i] = offset;
    offset += t.data.nbytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > max_header_bytes) {
    refuse(fmt::format("the header would be {} bytes, above the format's limit of {}", json.size(), max_header_bytes));
  }
  l.data_nbytes = offset;
  const std::uint64_t n = json.size();
  l.header.resize(8);
  for (int b = 0; b < 8; ++b) l.header[b] = static_cast<char>((n >> (8 * b)) & 0xFF);
  l.header += json;
  return l;
}

void write_to_memory(const std::vector<save_tensor>& tensors, const save_layout& layout, void* dst) {
  auto* out = static_cast<std::uint8_t*>(dst);
  std::memcpy(out, layout.header.data(), layout.header.size());
  for (std::size_t i : layout.order) {
    const auto& t = tensors[i];
    std::uint8_t* base = out + layout.header.size() + layout.begin_bytes[i];
    if (!t.source) {
      if (t.data.nbytes > 0) copy_out(t.data, 0, base, t.data.nbytes);
      continue;
    }
    for (std::uint64_t off = 0; off < t.data.nbytes;) {
      const buffer_view v = next_view(t, off);
      copy_out(v, 0, base + off, v.nbytes);
      off += v.nbytes;
    }
  }
}

void check_save_target(const std::filesystem::path& path, bool overwrite) {
  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    const int e = errno;
    throw error(errno_code(e), "save", path.string(), -1, 0,
                e == ENOENT ? fmt::format("its folder {} does not exist", printable_name(folder.string())) : "its folder");
  }
  if (!S_ISDIR(st.st_mode)) {
    throw error(errno_code(ENOTDIR), "save", path.string(), -1, 0, fmt::format("{} is not a folder", printable_name(folder.string())));
  }
  if (::lstat(path.c_str(), &st) != 0) return;  // a new name
  if (S_ISDIR(st.st_mode)) throw error(errno_code(EISDIR), "save", path.string(), -1, 0, "a folder, not a file");
  if (!overwrite) throw error(errno_code(EEXIST), "save", path.string(), -1, 0, "overwrite not set");
}

save_stats save(const std::filesystem::path& path, const std::vector<save_tensor>& tensors,
                const std::optional<metadata_entries>& metadata, const save_options& options) {
  check_options(options);
  check_save_target(path, options.overwrite);
  save_stats stats;
  temp_names names;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    pending_file p = open_pending(path, tensors, metadata, options, names);
    std::atomic<std::uint64_t> done{0};
    write_file(p.handle, p.tensors, p.layout, options, done, p.layout.data_nbytes, stats);
    stats.path = plan_for(p.handle, p.tensors);  // after the writes: the schedule they ended with
    const auto t_sync = std::chrono::steady_clock::now();
    p.publish.rename_and_sync_folder();
    stats.sync_seconds += seconds_since(t_sync);
    stats.seconds = seconds_since(t0);
  } catch (const error& e) {
    rethrow_for_target(e, names);
  }
  stats.written.push_back(path);
  return stats;
}

std::vector<std::vector<std::size_t>> plan_shards(const std::vector<save_tensor>& tensors, std::uint64_t max_shard_bytes) {
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  std::uint64_t current_bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t n = tensors[i].data.nbytes;
    if (n > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + n > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += n;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::optional<std::uint64_t> parse_shard_size(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  static constexpr std::pair<std::string_view, double> units[] = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0},
      {"TB", 1e12},             {"GB", 1e9},           {"MB", 1e6},       {"KB", 1e3}};
  double mult = 1;
  for (const auto& [u, m] : units) {
    if (text.size() > u.size() && std::equal(u.begin(), u.end(), text.end() - static_cast<std::ptrdiff_t>(u.size()),
                                             [](char a, char b) { return std::toupper(static_cast<unsigned char>(a)) ==
                                                                         std::toupper(static_cast<unsigned char>(b)); })) {
      mult = m;
      text.remove_suffix(u.size());
      break;
    }
  }
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty() || text.size() > 32) return std::nullopt;
  const std::string s(text);
  if (s.find_first_not_of("0123456789.") != std::string::npos || std::count(s.begin(), s.end(), '.') > 1) {
    return std::nullopt;
  }
  if (mult == 1) {
    // Plain bytes: exact, up to 2^64 - 1.
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec != std::errc{} || end != s.data() + s.size() || n == 0) return std::nullopt;
    return n;
  }
  // Byte counts are 64-bit: a size of 2^64 bytes or more (or less than one byte) is no size.
  const double v = std::strtod(s.c_str(), nullptr) * mult;
  if (!(v >= 1) || !(v < 18446744073709551616.0)) return std::nullopt;
  return static_cast<std::uint64_t>(v);
}

std::string shard_file_name(std::size_t k, std::size_t n) {
  if (n == 1) return "model.safetensors";
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n);
}

std::string index_json(const std::vector<std::pair<std::string, std::string>>& weight_map, std::uint64_t total_size) {
  nlohmann::json j;
  j["metadata"]["total_size"] = total_size;
  auto& wm = j["weight_map"];
  wm = nlohmann::json::object();
  for (const auto& [name, file] : weight_map) wm[name] = file;
  return j.dump(2) + "\n";
}

void write_index(const std::filesystem::path& folder,
                 const std::vector<std::pair<std::string, std::string>>& weight_map, std::uint64_t total_size,
                 bool overwrite) {
  posix::atomic_write_file(folder / "model.safetensors.index.json", index_json(weight_map, total_size), 0644,
                           overwrite);
}

save_stats save_sharded(const std::filesystem::path& folder, const std::vector<save_tensor>& tensors,
                        const std::optional<metadata_entries>& metadata, const save_options& options) {
  check_options(options);
  // Names, sizes, metadata: fail before anything is created.
  plan_save(tensors, std::nullopt);
  plan_save({}, metadata);
  const auto groups = plan_shards(tensors, options.max_shard_bytes);
  const std::size_t n = std::max<std::size_t>(1, groups.size());
  const std::filesystem::path index = folder / "model.safetensors.index.json";
  std::vector<std::filesystem::path> targets;
  for (std::size_t k = 1; k <= n; ++k) targets.push_back(folder / shard_file_name(k, n));
  if (!options.overwrite) {
    std::error_code ec;
    for (const auto& t : targets) {
      if (std::filesystem::symlink_status(t, ec).type() != std::filesystem::file_type::not_found) {
        throw error(errno_code(EEXIST), "create", t.string(), -1, 0, "overwrite not set");
      }
    }
    // One shard has no index, but an index left in the folder would still name the old checkpoint: it counts.
    if (std::filesystem::symlink_status(index, ec).type() != std::filesystem::file_type::not_found) {
      throw error(errno_code(EEXIST), "create", index.string(), -1, 0, "overwrite not set");
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw error(ec, "create folder", folder.string(), -1, 0);

  save_stats stats;
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.data.nbytes;
  std::atomic<std::uint64_t> done{0};
  // Every shard is written and synced under its temporary name before any is renamed: an error while writing
  // leaves an earlier checkpoint in this folder as it was.
  std::vector<pending_file> files;
  files.reserve(n);
  temp_names names;
  try {
    for (std::size_t k = 0; k < n; ++k) {
      std::vector<save_tensor> part;
      if (!groups.empty()) {
        for (std::size_t i : groups[k]) part.push_back(tensors[i]);
      }
      files.push_back(open_pending(targets[k], std::move(part), metadata, options, names));
      write_file(files[k].handle, files[k].tensors, files[k].layout, options, done, total, stats);
      if (k == 0) stats.path = plan_for(files[0].handle, files[0].tensors);  // the schedule the writes ended with
      files[k].handle = file_handle();  // synced: close it, thousands of shards need no thousands of descriptors
    }
    posix::atomic_publish index_file;
    if (n > 1) {
      std::vector<std::pair<std::string, std::string>> weight_map;
      for (std::size_t k = 0; k < n; ++k) {
        for (std::size_t i : groups[k]) weight_map.emplace_back(tensors[i].name, shard_file_name(k + 1, n));
      }
      index_file = posix::write_unpublished(index, index_json(weight_map, total), 0644, options.overwrite);
      names.emplace_back(index_file.temp_path().string(), index);
    }
    // Only renames remain: the shards, then the index, so the index never names a shard not whole on disk.
    const auto t_sync = std::chrono::steady_clock::now();
    const auto backups = protect_old_checkpoint(index, targets);
    for (auto& f : files) f.publish.rename_and_sync_folder();
    stats.written = targets;
    if (n > 1) {
      index_file.rename_and_sync_folder();
      stats.written.push_back(index);
    }
    if (n == 1 && std::filesystem::symlink_status(index, ec).type() != std::filesystem::file_type::not_found) {
      // Readers prefer an index to model.safetensors: one naming the previous checkpoint must go.
      if (posix::sys().unlink(index.c_str()) != 0) throw error(errno_code(errno), "remove", index.string(), -1, 0);
      posix::sync_folder(folder);
    }
    for (const auto& b : backups) posix::sys().unlink(b.c_str());
    stats.sync_seconds += seconds_since(t_sync);
  } catch (const error& e) {
    rethrow_for_target(e, names);
  }
  stats.seconds = seconds_since(t0);
  return stats;
}

}  // namespace gdskit::safetensors
