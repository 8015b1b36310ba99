// One launch copies many small pieces between page-locked host memory (mapped into the device's address space)
// and device memory, in either direction: the group copier's route for pieces too small for a copy engine to
// move them one by one at rate. Compiled to PTX by scripts/gen-kernels.sh into copy_pieces_ptx.hpp, which the
// library loads at run time (cuModuleLoadData); the build itself needs no CUDA compiler.
//
// A piece is {src, dst, nbytes}, addresses as the device sees them. Block b copies pieces b, b + gridDim.x, ...
// Host memory is read with loads that bypass the caches (.cv): staging slots are reused from one launch to the
// next, and each byte is read once anyway.

struct piece {
  unsigned long long src;
  unsigned long long dst;
  unsigned long long nbytes;
};

extern "C" __global__ void gdskit_copy_pieces(const piece* __restrict__ pieces, unsigned count) {
  for (unsigned e = blockIdx.x; e < count; e += gridDim.x) {
    const piece p = pieces[e];
    const unsigned char* s = reinterpret_cast<const unsigned char*>(p.src);
    unsigned char* d = reinterpret_cast<unsigned char*>(p.dst);
    unsigned long long n = p.nbytes;
    // Bytes up to the first 16-byte boundary of both (when both reach one at the same offset), then 16 bytes
    // per load, then the tail; else byte by byte.
    unsigned long long head = 0;
    if (((p.src ^ p.dst) & 15) == 0) {
      head = (16 - (p.src & 15)) & 15;
      if (head > n) head = n;
    } else {
      head = n;
    }
    for (unsigned long long i = threadIdx.x; i < head; i += blockDim.x) d[i] = __ldcv(s + i);
    const unsigned long long words = (n - head) / 16;
    const uint4* sv = reinterpret_cast<const uint4*>(s + head);
    uint4* dv = reinterpret_cast<uint4*>(d + head);
    // Four loads in flight per thread before their stores: host memory is a bus crossing away.
    const unsigned long long step = blockDim.x;
    unsigned long long i = threadIdx.x;
    for (; i + 3 * step < words; i += 4 * step) {
      const uint4 a = __ldcv(sv + i), b = __ldcv(sv + i + step), c = __ldcv(sv + i + 2 * step),
                  e4 = __ldcv(sv + i + 3 * step);
      dv[i] = a;
      dv[i + step] = b;
      dv[i + 2 * step] = c;
      dv[i + 3 * step] = e4;
    }
    for (; i < words; i += step) dv[i] = __ldcv(sv + i);
    for (unsigned long long i = head + words * 16 + threadIdx.x; i < n; i += blockDim.x) d[i] = __ldcv(s + i);
  }
}
