#include "bench/transfer.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "gdskit/buffer.hpp"
#include "gdskit/error.hpp"

namespace gdskit::bench {

namespace {

// Host memory aligned for O_DIRECT, so the engine never needs a bounce buffer for the body of a request.
class host_transfer final : public transfer {
 public:
  explicit host_transfer(std::size_t capacity) : nbytes_(capacity) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, capacity == 0 ? 4096 : capacity) != 0) throw std::bad_alloc();
    buf_ = static_cast<std::byte*>(p);
  }
  ~host_transfer() override { std::free(buf_); }
  host_transfer(const host_transfer&) = delete;
  host_transfer& operator=(const host_transfer&) = delete;

  std::size_t read(const file_handle& f, std::uint64_t offset, std::size_t n) override {
    return f.pread(buf_, n, offset);
  }
  std::size_t write(const file_handle& f, std::uint64_t offset, std::size_t n) override {
    return f.pwrite(buf_, n, offset);
  }
  void load(const std::byte* src, std::size_t n, std::size_t at) override { std::memcpy(buf_ + at, src, n); }
  void store(std::byte* dst, std::size_t n, std::size_t at) override { std::memcpy(dst, buf_ + at, n); }
  buffer_view memory() const override { return buffer_view::host(buf_, nbytes_); }

 private:
  std::byte* buf_ = nullptr;
  std::size_t nbytes_ = 0;
};

}  // namespace

bool gpu_usable(std::string* reason) { return gpu_available(reason); }
int gpu_devices() { return gpu_count(); }

std::unique_ptr<transfer> make_transfer(xfer_kind xfer, std::size_t capacity, int gpu, bool stream) {
  if (!needs_gpu(xfer)) return std::make_unique<host_transfer>(capacity);
  return make_gpu_transfer(xfer, capacity, gpu, stream);
}

path_report describe_path(xfer_kind xfer, const file_handle& f, int gpu) {
  if (needs_gpu(xfer)) return describe_gpu_path(xfer, f, gpu);
  const io_choice& c = f.choice();
  return {"host", {"host memory (pread/pwrite)", c.direct_reason,
                   c.engine == engine_kind::io_uring ? "engine io_uring: " + c.engine_reason
                                                     : "engine threads: " + c.engine_reason}};
}

}  // namespace gdskit::bench
