// Writes a file through an installed gdskit and reads it back.
#include <gdskit/error.hpp>
#include <gdskit/file.hpp>
#include <gdskit/version.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::vector<char> data(3 * 1024 * 1024 + 7);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  try {
    gdskit::file_handle w(argv[1], gdskit::open_mode::write, {.create = true, .truncate = true});
    w.pwrite(data.data(), data.size(), 0);
    gdskit::file_handle r(argv[1], gdskit::open_mode::read);
    std::vector<char> back(data.size());
    r.read_exact(back.data(), back.size(), 0);
    if (std::memcmp(back.data(), data.data(), data.size()) != 0) return 1;
  } catch (const gdskit::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::printf("consumer of gdskit %s: round trip ok\n", GDSKIT_VERSION_STRING);
  return 0;
}
