#include "posix/in_root.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace gdskit::posix {
namespace fs = std::filesystem;
namespace {

// At most this many symbolic links are followed while one path is resolved (the kernel's own limit).
constexpr int max_link_hops = 40;

std::vector<std::string> path_parts(std::string_view p) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < p.size()) {
    auto j = p.find('/', i);
    if (j == std::string_view::npos) j = p.size();
    if (j > i && p.substr(i, j - i) != ".") out.emplace_back(p.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::error_code last_error() { return {errno, std::generic_category()}; }

// Walks `rel` under `root` one component at a time, following links inside it, and opens what it reaches with
// `flags`. `names` (when given) receives the components of what was reached, relative to the root.
unique_fd walk(const fs::path& root, std::string_view rel, int flags, std::error_code& ec, std::string& why,
               std::vector<std::string>* names) {
  ec.clear();
  why.clear();
  std::vector<unique_fd> dirs;  // dirs[0] is the root, dirs.back() the folder reached so far
  std::vector<std::string> reached;
  dirs.emplace_back(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dirs.back()) {
    ec = last_error();
    return {};
  }
  std::vector<std::string> todo = path_parts(rel);
  std::reverse(todo.begin(), todo.end());  // a stack: the next component is at the back
  int hops = 0;
  auto refuse = [&] {
    ec = std::make_error_code(std::errc::permission_denied);
    why = "a link in the root leads outside it";
    return unique_fd{};
  };
  auto here = [&](int open_flags) {
    unique_fd fd(::openat(dirs.back().get(), ".", open_flags | O_CLOEXEC));
    if (!fd) ec = last_error();
    if (names != nullptr) *names = reached;
    return fd;
  };
  while (!todo.empty()) {
    const std::string name = std::move(todo.back());
    todo.pop_back();
    if (name == "..") {
      if (dirs.size() == 1) return refuse();
      dirs.pop_back();
      reached.pop_back();
      continue;
    }
    unique_fd node(::openat(dirs.back().get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!node) {
      ec = last_error();
      return {};
    }
    struct stat st {};
    if (::fstat(node.get(), &st) != 0) {
      ec = last_error();
      return {};
    }
    if (S_ISLNK(st.st_mode)) {
      if (++hops > max_link_hops) {
        ec = std::make_error_code(std::errc::too_many_symbolic_link_levels);
        return {};
      }
      std::string target(4096, '\0');
      const ssize_t n = ::readlinkat(node.get(), "", target.data(), target.size());
      if (n < 0 || static_cast<std::size_t>(n) >= target.size()) {
        ec = n < 0 ? last_error() : std::make_error_code(std::errc::filename_too_long);
        return {};
      }
      target.resize(static_cast<std::size_t>(n));
      // An absolute link names the machine that holds the capture, never the captured one.
      if (target.empty() || target[0] == '/') return refuse();
      auto parts = path_parts(target);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_back(*it);
      continue;
    }
    if (todo.empty()) {
      // The last component, opened for real; O_NOFOLLOW: a link put there since the check is refused.
      unique_fd fd(::openat(dirs.back().get(), name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC));
      if (!fd) ec = last_error();
      reached.push_back(name);
      if (names != nullptr) *names = std::move(reached);
      return fd;
    }
    if (!S_ISDIR(st.st_mode)) {
      ec = std::make_error_code(std::errc::not_a_directory);
      return {};
    }
    dirs.push_back(std::move(node));
    reached.push_back(name);
  }
  // The path ended in a folder, "..", or a link to a folder: open the folder reached.
  return here(flags);
}

}  // namespace

unique_fd open_in_root(const fs::path& root, std::string_view rel, int flags, std::error_code& ec,
                       std::string& why) noexcept {
  try {
    return walk(root, rel, flags, ec, why, nullptr);
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    return {};
  }
}

std::optional<std::string> resolve_in_root(const fs::path& root, std::string_view rel, std::error_code& ec,
                                           std::string& why) noexcept {
  try {
    std::vector<std::string> names;
    if (!walk(root, rel, O_PATH, ec, why, &names)) return std::nullopt;
    std::string out;
    for (const auto& n : names) {
      if (!out.empty()) out += '/';
      out += n;
    }
    return out;
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    return std::nullopt;
  }
}

fs::path root_files::abs(std::string_view rel) const {
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  return root_ / rel;
}

unique_fd root_files::open(std::string_view rel, int flags, bounded_text& failed) const {
  std::error_code ec;
  std::string why;
  unique_fd fd = open_in_root(root_, rel, flags, ec, why);
  if (!fd) {
    failed.error = ec;
    failed.why = std::move(why);
  }
  return fd;
}

bounded_text root_files::read(std::string_view rel, std::size_t max_bytes, bool tail) const {
  if (live_) return read_bounded(abs(rel), max_bytes, tail);
  bounded_text failed;
  unique_fd fd = open(rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, failed);
  if (!fd) return failed;
  return read_bounded(std::move(fd), max_bytes, tail);
}

bounded_text root_files::scan_lines(std::string_view rel, std::size_t max_total_bytes, std::size_t max_line_bytes,
                                    const std::function<void(std::string_view)>& on_line) const {
  if (live_) return scan_lines_bounded(abs(rel), max_total_bytes, max_line_bytes, on_line);
  bounded_text failed;
  unique_fd fd = open(rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, failed);
  if (!fd) return failed;
  return scan_lines_bounded(std::move(fd), max_total_bytes, max_line_bytes, on_line);
}

bool root_files::exists(std::string_view rel) const {
  if (live_) {
    std::error_code ec;
    return fs::exists(abs(rel), ec);
  }
  std::error_code ec;
  std::string why;
  return resolve_in_root(root_, rel, ec, why).has_value();
}

bool root_files::is_directory(std::string_view rel) const {
  if (live_) {
    std::error_code ec;
    return fs::is_directory(abs(rel), ec);
  }
  bounded_text failed;
  return static_cast<bool>(open(rel, O_RDONLY | O_DIRECTORY, failed));
}

std::optional<std::string> root_files::resolve(std::string_view rel) const {
  std::error_code ec;
  if (live_) {
    const fs::path p = fs::canonical(abs(rel), ec);
    if (ec) return std::nullopt;
    return p.lexically_relative(root_).string();
  }
  std::string why;
  return resolve_in_root(root_, rel, ec, why);
}

std::vector<std::string> root_files::list(std::string_view rel, std::error_code& ec, std::size_t max_entries) const {
  std::vector<std::string> names;
  ec.clear();
  unique_fd fd;
  if (live_) {
    fd = unique_fd(::open(abs(rel).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) ec = last_error();
  } else {
    bounded_text failed;
    fd = open(rel, O_RDONLY | O_DIRECTORY, failed);
    if (!fd) ec = failed.error;
  }
  if (!fd) return names;
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) {
    ec = last_error();
    return names;
  }
  fd.release();  // closedir closes it
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n == "." || n == "..") continue;
    if (names.size() >= max_entries) break;
    names.emplace_back(n);
  }
  ::closedir(d);
  return names;
}

}  // namespace gdskit::posix
