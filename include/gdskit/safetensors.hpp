// safetensors: parse and validate headers, and load tensors (whole files, sharded checkpoints, subsets and
// tensor-parallel slices) into host or GPU memory through file_handle::read. Format notes: docs/safetensors.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gdskit/buffer.hpp"
#include "gdskit/path.hpp"
#include "gdskit/settings.hpp"

namespace gdskit {

class file_handle;

namespace safetensors {

/// Element types of the format. F4 (4 bits) and F6_* (6 bits) are packed: a tensor of them must hold a whole
/// number of bytes.
enum class dtype {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F4, F6_E2M3, F6_E3M2,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64
};

/// "BF16", ...
std::string_view to_string(dtype t) noexcept;
/// The dtype named `text` exactly as the format spells it, or nullopt.
std::optional<dtype> parse_dtype(std::string_view text) noexcept;
/// Bits per element: 4 (F4), 6 (F6_*), 8 .. 64.
unsigned bits_of(dtype t) noexcept;

/// `name` (a tensor name or other text read from a file) made safe to print on a terminal or in a line-based
/// report: control bytes become C escapes (\n, \t, \x1b, ...), a backslash becomes \\, bytes that are not
/// UTF-8 become \xNN, and C1 controls and bidirectional overrides become \uNNNN. Printable UTF-8 is kept.
std::string printable_name(std::string_view name);

/// Largest JSON header accepted (the 8-byte length field above this is rejected): 100 MiB.
inline constexpr std::uint64_t max_header_bytes = std::uint64_t{100} << 20;
/// Largest number of dimensions accepted for one tensor.
inline constexpr std::size_t max_rank = 64;

/// One tensor of a file as its header describes it. Offsets are 64-bit everywhere.
struct tensor_info {
  std::string name;
  safetensors::dtype dtype = safetensors::dtype::U8;
  std::vector<std::uint64_t> shape;  ///< empty for a 0-dim (scalar) tensor
  std::uint64_t begin_bytes = 0;     ///< data_offsets[0], relative to the start of the data section
  std::uint64_t end_bytes = 0;       ///< data_offsets[1]
  std::uint64_t file_offset_bytes = 0;  ///< absolute offset of the first byte in the file

  std::uint64_t nbytes() const noexcept { return end_bytes - begin_bytes; }
  /// Product of the shape (1 for a 0-dim tensor, 0 when a dimension is 0).
  std::uint64_t numel() const noexcept;
};

/// A parsed, validated header.
struct header {
  std::uint64_t json_nbytes = 0;        ///< the 8-byte length field
  std::uint64_t data_offset_bytes = 0;  ///< 8 + json_nbytes: where the data section starts
  std::uint64_t file_nbytes = 0;        ///< size of the whole file
  std::vector<tensor_info> tensors;     ///< sorted by begin_bytes (then name)
  std::map<std::string, std::string> metadata;  ///< "__metadata__" (string -> string), may be empty

  /// The tensor called `name`, or nullptr.
  const tensor_info* find(std::string_view name) const noexcept;
};

/// Parses and validates a header held in memory. `bytes` starts at the beginning of the file and holds at least
/// the 8-byte length and the JSON (more is allowed: it may be the whole file); `file_nbytes` is the size of the
/// whole file (offsets are checked against it). `source` names the file in error messages.
/// Throws gdskit::error with EBADMSG when the header is malformed: too short, length field above
/// max_header_bytes or past the end of the file, invalid UTF-8, JSON syntax errors or trailing bytes other than
/// spaces, duplicate names (at any level), an unknown dtype, a dimension that is negative, not an integer,
/// above 2^63-1 (even in an empty tensor) or overflows, data_offsets that are not two ordered integers, a span that differs from numel x dtype size, a
/// packed tensor that is not a whole number of bytes, offsets past the end of the file, or two tensors sharing
/// bytes. Gaps between tensors are allowed. Time and memory are linear in the header size (n log n in the
/// tensor count).
header parse_header(const void* bytes, std::size_t nbytes, std::uint64_t file_nbytes, std::string_view source);
/// Opens a safetensors file, shard or index for reading. Unlike file_handle's constructor it cannot block on a
/// FIFO, and it refuses anything but a regular file, naming the path: EISDIR for a folder, EINVAL for a FIFO,
/// socket or device (block devices included: the engine sizes files with fstat). Open errors keep their errno.
file_handle open_file(const std::filesystem::path& path, const settings& config = default_settings());
/// Reads and parses the header of an open file (two small reads). Throws as parse_header, and I/O errors.
header read_header(const file_handle& file);
/// Opens `path` with open_file() and reads its header.
header read_header(const std::filesystem::path& path);

/// A tensor-parallel slice: rank `rank` of `world` takes its part of dimension `dim`. A dimension of size n
/// is split like numpy.array_split: the first n % world ranks get one more row. Tensors with `dim` or fewer
/// dimensions are loaded whole on every rank (biases, norms, scalars).
struct slice_spec {
  unsigned rank = 0;
  unsigned world = 1;
  unsigned dim = 0;
};

/// The rows of a dimension of size `n` that rank `rank` of `world` takes, as (first row, row count): the
/// numpy.array_split rule of slice_spec. EINVAL unless 0 <= rank < world.
std::pair<std::uint64_t, std::uint64_t> split_rows(std::uint64_t n, unsigned rank, unsigned world);

/// Whether an `only` entry (load_options::only) selects the tensor called `name`: the same name, or a prefix
/// of it when the entry ends in '.' (kept) or '*' (removed). An empty entry selects nothing.
bool name_matches(std::string_view entry, std::string_view name) noexcept;

/// What to load and where.
struct load_options {
  /// -1: host memory; >= 0: the CUDA device ordinal (one device_buffer per shard holds its tensors).
  int device = -1;
  /// Names to load. An entry matches a tensor with exactly that name; an entry ending in '.' or '*' matches
  /// every name that starts with it (the '*' removed). Empty: every tensor. An entry that matches nothing
  /// is an error (EINVAL), so typos do not pass silently.
  std::vector<std::string> only;
  std::optional<slice_spec> slice;
  /// Host memory the loader may use beyond the tensors, for gathering strided slices (rows of a slice along a
  /// dimension other than 0 that are too small to read one by one). The engine's pinned staging slots for the
  /// GPU path come on top (settings: threads x staging_slots x staging_slot_bytes).
  std::size_t staging_budget_bytes = std::size_t{64} << 20;
  /// Selected tensors closer than this in the file are read in one request together with the gap between
  /// them (the gap lands in the allocation and is never exposed).
  std::size_t coalesce_gap_bytes = std::size_t{64} << 10;
  /// The reads of all files are cut into segments of this size (at absolute file offsets, a multiple of 4 KiB),
  /// each shard's segments one batch of the transfer core with `pipeline_depth` segments in flight (each segment
  /// itself read at the device's depth). The load streams: the first shard's batch starts as soon as its header
  /// is parsed and its memory allocated, and each later header is read, parsed and allocated for on the calling
  /// thread while earlier shards' segments read; a shard's batch starts once the one before it has at most one
  /// segment left (so at most `pipeline_depth` + 1 segments read at once).
  std::size_t pipeline_segment_bytes = std::size_t{256} << 20;
  unsigned pipeline_depth = 2;
  /// Settings for opening the files.
  settings config = default_settings();
  /// Where the allocations come from: one per shard that has selected tensors (one for a single file), or
  /// one of a byte when nothing is selected. Empty: the loader allocates them (host memory or cuMemAlloc)
  /// and the model owns them. Set: called once per such shard, in file order, on the thread that called
  /// load(), with that shard's byte count, it returns memory of at least that size on `device` (e.g. from a
  /// framework's caching allocator); the caller keeps it alive as long as the tensors. Earlier shards'
  /// segments may be reading while it runs; after a failed read it is still called for the remaining shards
  /// (so which error load() reports does not depend on timing). Once load() has thrown, nothing writes to
  /// the memory it returned.
  std::function<buffer_view(std::uint64_t nbytes)> allocate;
};

/// A loaded tensor: a view into the model's allocation (or the caller's destination).
struct loaded_tensor {
  std::string name;
  safetensors::dtype dtype = safetensors::dtype::U8;
  std::vector<std::uint64_t> shape;       ///< shape as loaded (the slice's shape when sliced)
  std::vector<std::uint64_t> full_shape;  ///< shape in the file
  buffer_view data;                       ///< data.nbytes is the loaded byte count
  std::filesystem::path file;             ///< the file it came from
};

/// What a load did.
struct load_stats {
  std::uint64_t bytes_read = 0;    ///< bytes requested from files (including coalesced gaps)
  std::uint64_t tensor_bytes = 0;  ///< bytes of tensors delivered
  std::size_t files = 0;
  std::size_t read_requests = 0;
  std::size_t segments = 0;                ///< pipeline segments read (see load_options::pipeline_segment_bytes)
  unsigned peak_segments_in_flight = 0;    ///< most segments reading at once
  /// Wall time from the first data read to the last. Later shards' headers and allocations happen during it
  /// (overlapped_seconds), the first shard's before it (first_read_seconds).
  double seconds = 0;
  double header_seconds = 0;       ///< wall time spent reading and parsing the index and headers, and selecting
  double alloc_seconds = 0;        ///< wall time spent obtaining the allocations
  /// Of header_seconds + alloc_seconds, the part spent while data reads of earlier shards were queued or in
  /// flight: header work that streaming hid behind reads.
  double overlapped_seconds = 0;
  double first_read_seconds = 0;   ///< from the start of the load to its first data read (0: nothing read)
  std::size_t allocations = 0;     ///< allocations the tensors view (see load_options::allocate)
  path_decision path;              ///< the planner's path for the destination memory
  double gib_per_s() const noexcept { return seconds > 0 ? static_cast<double>(tensor_bytes) / seconds / 1073741824.0 : 0; }
};

/// The result of load(): owns the allocations (host or GPU; one per shard with selected tensors) that the
/// tensors view. Move-only; the views are valid while it lives.
class model {
 public:
  model() noexcept;
  ~model();
  model(model&&) noexcept;
  model& operator=(model&&) noexcept;

  const std::vector<loaded_tensor>& tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const loaded_tensor* find(std::string_view name) const noexcept;
  /// "__metadata__" of the file (of the first shard for a sharded checkpoint).
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const load_stats& stats() const noexcept { return stats_; }
  /// The first allocation: the one every tensor views when the load read one file.
  buffer_view storage() const noexcept;
  /// Every allocation, in file order (each tensor views one of them).
  std::vector<buffer_view> allocations() const;
  /// Copies a tensor's bytes to host memory (from the GPU when it lives there).
  std::vector<std::uint8_t> to_host(const loaded_tensor& t) const;
  /// sha256 of a tensor's raw bytes as 64 hex digits.
  std::string sha256_hex(const loaded_tensor& t) const;

  struct storage_impl;

 private:
  friend model load(const std::filesystem::path&, const load_options&);
  std::shared_ptr<storage_impl> storage_;
  std::vector<loaded_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
  load_stats stats_;

 public:
  /// Shared ownership of the allocations, for bindings that hand views to other runtimes (DLPack).
  std::shared_ptr<void> keep_alive() const noexcept { return std::static_pointer_cast<void>(storage_); }
};

/// Loads a .safetensors file, a sharded checkpoint's index (*.safetensors.index.json, "weight_map"), or a
/// folder (its model.safetensors.index.json if present, else every *.safetensors in it). Adjacent selected
/// tensors are read in one request; every tensor is a view into its shard's allocation on options.device.
/// Throws gdskit::error: EBADMSG for malformed headers or indexes (and a tensor name present in two shards),
/// EINVAL for bad options (an `only` entry that matches nothing, a slice with rank >= world or world 0, a slice
/// of a packed dtype that does not fall on byte boundaries), ENOENT when nothing loadable is found, and I/O,
/// CUDA or allocation errors from the engine. Which error: the first shard (in load order) whose open, header
/// or selection fails; else an unmatched `only` entry; else a failed allocation; else the first failing read
/// (by shard and offset). Reads already running when an error is found finish before load() throws; none are
/// left running.
model load(const std::filesystem::path& path, const load_options& options = {});

/// The files a path stands for (see load()), in load order, each with the names the index assigns to it
/// (empty: every tensor of the file).
struct shard {
  std::filesystem::path file;
  std::vector<std::string> names;
};
std::vector<shard> resolve_shards(const std::filesystem::path& path);

/// Reads the named tensors into caller-provided memory: `destinations` maps a tensor name to a buffer (host or
/// GPU) of at least the tensor's (or its slice's) size. options.only is ignored; options.slice applies.
/// Throws EINVAL for a name the file lacks or a buffer that is too small, and what load() throws.
load_stats load_into(const std::filesystem::path& file, const std::map<std::string, buffer_view>& destinations,
                     const load_options& options = {});

/// The byte ranges of a tensor that a slice needs, relative to the tensor's first byte, and the slice's shape.
/// Exposed for tests and tools. Throws EINVAL as load() does for a bad slice.
struct slice_plan {
  std::vector<std::uint64_t> shape;
  std::uint64_t segment_bytes = 0;   ///< bytes of each contiguous segment
  std::uint64_t first_offset = 0;    ///< offset of the first segment
  std::uint64_t stride_bytes = 0;    ///< distance between segment starts
  std::uint64_t segments = 1;        ///< number of segments
  /// Bytes of one index of the split dimension (a segment holds the rank's rows of it); 0 when the tensor is
  /// not split (no slice, a dimension it lacks) or has no bytes.
  std::uint64_t row_bytes = 0;
  std::uint64_t nbytes() const noexcept { return segment_bytes * segments; }
};
slice_plan plan_slice(const tensor_info& t, const std::optional<slice_spec>& slice);

}  // namespace safetensors
}  // namespace gdskit

// ---------------------------------------------------------------------------------------------------------------
// Writing: safetensors files and sharded checkpoints from host, pinned or GPU memory, published atomically.
// ---------------------------------------------------------------------------------------------------------------

namespace gdskit::safetensors {

/// One tensor to save: its name, dtype, shape and a view of its bytes (C order, little-endian) in host, pinned,
/// managed or GPU memory. `data.nbytes` must equal numel x dtype size; the memory must stay valid and unchanged
/// until save() returns.
struct save_tensor {
  std::string name;
  safetensors::dtype dtype = safetensors::dtype::U8;
  std::vector<std::uint64_t> shape;  ///< empty for a 0-dim tensor
  /// The bytes. With `source` set, only data.nbytes counts (data.data may be null).
  buffer_view data;
  /// For tensors whose bytes are not in one piece of memory (strided views): called with an offset into the
  /// tensor's C-order bytes, returns a view of the bytes from there on (at least 1 byte, at most the rest),
  /// valid until the next call. Such tensors are written after the others, one at a time, from one thread, so
  /// the caller needs staging memory for one view at a time.
  std::function<buffer_view(std::uint64_t offset_bytes)> source;
};

/// "__metadata__" entries in the order they are written (safetensors itself writes them in hash order, so with
/// more than one key its files agree with ours only up to that order). nullopt: no "__metadata__" key; an empty
/// list writes "__metadata__":{} as safetensors does for an empty dict.
using metadata_entries = std::vector<std::pair<std::string, std::string>>;

struct save_options {
  /// Replace existing files. Without it an existing file (any shard or the index for a sharded save) is EEXIST
  /// and nothing is written.
  bool overwrite = false;
  /// Sharded saves: the largest tensor bytes per shard, split the way huggingface_hub splits (in the given
  /// order; a shard is closed when the next tensor would tip it over; a tensor larger than the limit gets a
  /// shard of its own). 5 GB (decimal) as there.
  std::uint64_t max_shard_bytes = 5'000'000'000;
  /// Called from the saving threads after each piece with the tensor bytes written so far and the total.
  std::function<void(std::uint64_t done_bytes, std::uint64_t total_bytes)> progress;
  /// Polled between pieces: returning true stops the save with ECANCELED (nothing published).
  std::function<bool()> cancelled;
  /// Settings for opening the files.
  settings config = default_settings();
};

/// What a save did.
struct save_stats {
  std::uint64_t tensor_bytes = 0;  ///< bytes of tensor data written
  std::uint64_t file_bytes = 0;    ///< bytes of all files, headers included (index excluded)
  std::size_t files = 0;           ///< safetensors files written
  std::size_t pieces = 0;          ///< tensors handed to gathered writes, plus the views of tensors with a source
  double seconds = 0;              ///< wall time from opening the first file to the last rename
  double sync_seconds = 0;         ///< of which fdatasync and folder fsync
  path_decision path;              ///< the planner's path for the first tensor's memory, asked after the first
                                   ///< file's data was written (its reasons give the shape its writes ended with)
  std::vector<std::filesystem::path> written;  ///< final names: shards in order, then the index if any
  double gib_per_s() const noexcept { return seconds > 0 ? static_cast<double>(tensor_bytes) / seconds / 1073741824.0 : 0; }
};

/// The layout save() writes: the header bytes (8-byte length, JSON, spaces up to a multiple of 8) and where
/// each tensor's data goes. The JSON is byte-identical to safetensors' own: tensors ordered by descending dtype
/// alignment then by name (bytewise), "__metadata__" first, keys "dtype","shape","data_offsets", no spaces.
struct save_layout {
  std::string header;                 ///< bytes 0 .. data_offset_bytes of the file
  std::vector<std::size_t> order;     ///< indexes into the tensors, in data order
  std::vector<std::uint64_t> begin_bytes;  ///< data offset of tensors[i] (indexed like the input)
  std::uint64_t data_nbytes = 0;
  std::uint64_t file_nbytes() const noexcept { return header.size() + data_nbytes; }
};
/// Validates the tensors and computes the layout. Throws gdskit::error (EINVAL) for an empty or duplicate name,
/// the name "__metadata__", a name or metadata text that is not valid UTF-8, duplicate metadata keys, a byte
/// count that differs from numel x dtype size (or a packed tensor that is not whole bytes), a null view of
/// nonzero size, or a header above max_header_bytes.
save_layout plan_save(const std::vector<save_tensor>& tensors, const std::optional<metadata_entries>& metadata);

/// Writes the file that save() would write for `layout` (plan_save of the same tensors and metadata) into host
/// memory `dst` of layout.file_nbytes() bytes: the bytes safetensors.torch.save returns. GPU tensors are copied
/// through the driver; tensors with a `source` view by view. Throws EINVAL for a source that misbehaves, and
/// CUDA errors.
void write_to_memory(const std::vector<save_tensor>& tensors, const save_layout& layout, void* dst);

/// Checks before anything is read, computed or written that `path` can take a saved file, naming `path` (never
/// a temporary name): ENOENT when its folder does not exist, ENOTDIR when that is not a folder, EISDIR when
/// `path` is a folder, EEXIST when it exists and !overwrite. save() checks it first; a program that loads or
/// computes the tensors before saving them calls it before that work.
void check_save_target(const std::filesystem::path& path, bool overwrite);

/// Writes one safetensors file at `path`: to a temporary name in its folder, tensor data first (in parallel,
/// through the engine's write path for each buffer: host I/O, or device -> pinned staging -> O_DIRECT), the
/// header last into its reserved place, then fdatasync, rename over `path` (atomic: a reader sees the old file
/// or the new one, whole), fsync of the folder. Throws gdskit::error: what check_save_target() and plan_save()
/// throw, ECANCELED when options.cancelled says so, and I/O (ENOSPC, EIO, ...) or CUDA errors naming `path`
/// (errors of the temporary file say so in their detail). On any error the temporary file is removed and an
/// existing file at `path` is untouched.
save_stats save(const std::filesystem::path& path, const std::vector<save_tensor>& tensors,
                const std::optional<metadata_entries>& metadata = std::nullopt, const save_options& options = {});

/// Which tensors go to which shard (indexes into `tensors`), the huggingface_hub rule (see save_options).
std::vector<std::vector<std::size_t>> plan_shards(const std::vector<save_tensor>& tensors, std::uint64_t max_shard_bytes);
/// A shard size limit: bytes ("1000000"), huggingface_hub's decimal units ("5GB", "500MB", "1.5GB": TB, GB, MB,
/// KB), or binary ones ("2GiB", "512MiB": TiB, GiB, MiB, KiB). nullopt for anything else, zero, or overflow.
std::optional<std::uint64_t> parse_shard_size(std::string_view text);
/// "model-00002-of-00005.safetensors" (1-based `k`), or "model.safetensors" when n is 1.
std::string shard_file_name(std::size_t k, std::size_t n);
/// The text of a sharded checkpoint's model.safetensors.index.json as save_sharded writes it:
/// {"metadata": {"total_size": N}, "weight_map": {name: file}} with the names sorted.
std::string index_json(const std::vector<std::pair<std::string, std::string>>& weight_map, std::uint64_t total_size);
/// Publishes `folder`/model.safetensors.index.json with index_json() atomically (temporary name, fdatasync,
/// rename, folder fsync), for savers that write the shards themselves (the distributed save). EEXIST when it
/// exists and !overwrite.
void write_index(const std::filesystem::path& folder,
                 const std::vector<std::pair<std::string, std::string>>& weight_map, std::uint64_t total_size,
                 bool overwrite);

/// Writes a checkpoint into `folder` (created if missing) in the Hugging Face layout: shards
/// model-0000k-of-0000n.safetensors (each with `metadata`) and model.safetensors.index.json
/// ({"metadata": {"total_size": N}, "weight_map": {name: file}}, names sorted); a single shard is written as
/// model.safetensors with no index, as huggingface_hub does. Every shard is written and synced under a
/// temporary name first; then the shards are renamed and the index is published last, so the index never
/// names a missing or partial shard. Shards of an earlier checkpoint that the new index no longer names are
/// left in place. Throws what save() throws; EEXIST (nothing written) when any of the files exists and
/// !options.overwrite.
save_stats save_sharded(const std::filesystem::path& folder, const std::vector<save_tensor>& tensors,
                        const std::optional<metadata_entries>& metadata = std::nullopt,
                        const save_options& options = {});

}  // namespace gdskit::safetensors
