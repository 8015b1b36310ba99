#include "gpu/routes.hpp"

#include "gpu/cuda_copier.hpp"
#include "gpu/cufile_path.hpp"
#include "gpu/group_copier.hpp"

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
  std::unique_ptr<engine::group_copier> make_group_copier(int device) override { return make_cuda_group_copier(device); }
};

}  // namespace

std::unique_ptr<engine::gpu_backend> make_backend() { return std::make_unique<backend>(); }

}  // namespace gdskit::gpu
