#include "gpu/routes.hpp"

#include "gpu/cuda_copier.hpp"
#include "gpu/cuda_raii.hpp"
#include "gpu/cufile_batch.hpp"
#include "gpu/cufile_path.hpp"
#include "gpu/group_copier.hpp"
#include "gpu/stream_order.hpp"

namespace gdskit::gpu {
namespace {

class lane_lease final : public engine::copier_lease {
 public:
  lane_lease(int device, unsigned lanes, unsigned slots, std::size_t slot_bytes) : lease_(device, lanes, slots, slot_bytes) {}
  engine::copier& get() override { return lease_.get(); }

 private:
  staging_lease lease_;
};

class backend final : public engine::gpu_backend {
 public:
  std::unique_ptr<engine::copier_lease> lease_lanes(int device, unsigned lanes, unsigned slots,
                                                    std::size_t slot_bytes) override {
    return std::make_unique<lane_lease>(device, lanes, slots, slot_bytes);
  }
  std::size_t cufile_transfer(const engine::open_file& f, bool write, buffer_view mem, std::size_t nbytes,
                              std::uint64_t offset) override {
    return gpu::cufile_transfer(f, write, mem, nbytes, offset);
  }
  bool cufile_batch(std::span<const engine::cufile_entry> entries, const std::function<bool()>& stop,
                    const std::function<void(std::size_t, std::size_t, std::error_code)>& done) override {
    const shim::cufile_api* api = shim::cufile();
    if (api == nullptr || !api->has_batch() || entries.empty()) return false;
    std::vector<cufile_batch_entry> cut;
    cut.reserve(entries.size());
    for (const auto& e : entries) {
      cut.push_back({cufile_handle_for(*e.file), e.write, e.mem.data, 0, e.offset, e.nbytes});
    }
    // cuFile needs the memory's context current on the thread that submits.
    const int device = entries.front().mem.device < 0 ? 0 : entries.front().mem.device;
    const context_guard ctx(device);
    run_cufile_batch(*api, cut, stop, done);
    return true;
  }
  std::unique_ptr<engine::group_copier> make_group_copier(int device) override { return make_cuda_group_copier(device); }
  std::function<void()> stream_gate(void* stream, int device) override { return gpu::stream_gate(stream, device); }
  void when_stream_reaches(void* stream, int device, std::function<void()> fn) override {
    gpu::when_stream_reaches(stream, device, std::move(fn));
  }
};

}  // namespace

std::unique_ptr<engine::gpu_backend> make_backend() { return std::make_unique<backend>(); }

}  // namespace gdskit::gpu
