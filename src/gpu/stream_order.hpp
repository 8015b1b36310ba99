// Ordering batches with CUDA streams: a stream that waits for a batch (reads), and a batch that waits for a
// stream (writes).
#pragma once

#include <functional>

namespace gdskit::gpu {

/// Enqueues on `stream` a wait (cuStreamWaitValue32 on a word of pinned memory) that the returned function ends
/// by raising the word; where the driver cannot wait on memory, a host function that blocks until then.
std::function<void()> stream_gate(void* stream, int device);

/// Enqueues on `stream` a host function that calls `fn`.
void when_stream_reaches(void* stream, int device, std::function<void()> fn);

}  // namespace gdskit::gpu
