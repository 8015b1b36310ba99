// Read a file into GPU memory with gdskit, and say which path moved the bytes and why.
//   read_to_gpu FILE [GPU]
#include <cstdio>
#include <cstdlib>

#include <gdskit/buffer.hpp>
#include <gdskit/error.hpp>
#include <gdskit/file.hpp>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: read_to_gpu FILE [GPU]\n");
    return 2;
  }
  try {
    gdskit::file_handle file(argv[1], gdskit::open_mode::read);
    std::string why;
    if (!gdskit::gpu_available(&why)) {
      std::fprintf(stderr, "no usable GPU: %s\n", why.c_str());
      return 1;
    }
    gdskit::device_buffer gpu(file.size(), argc > 2 ? std::atoi(argv[2]) : 0);
    std::printf("path: %s\n", file.plan(gpu.view()).summary().c_str());
    std::size_t n = file.read(gpu.view(), gpu.size(), 0);  // fewer bytes only if the file shrank meanwhile
    std::printf("read %zu bytes into GPU %d\n", n, gpu.device());
  } catch (const gdskit::error& e) {  // names the operation, the file, the offset and the size
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
