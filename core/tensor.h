// Tensor: a typed, shaped view into reference-counted device (or pinned host) storage.
// Storage comes from an Allocator: DeviceAllocator allocates straight from a Device; the caching
// allocator in memory/ implements the same interface. Views share storage (offset + shape).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace stp {

using Shape = std::vector<std::int64_t>;

std::int64_t numel(const Shape& shape);
std::string to_string(const Shape& shape);

// Bytes owned by one allocation; released through `release` when the last reference goes.
//
// Stream-ordered lifetime (CUDA's record_stream, made deterministic): record_use(s) notes that
// work enqueued on `s` so far reads or writes these bytes. The host may then drop its references
// right after enqueueing; `release` receives the streams, and the allocator makes whoever reuses
// the bytes wait for that work (memory/block_arena.h) or frees them once it has run
// (DeviceAllocator). So memory is accounted in host program order — the same on every run —
// while no byte is reused before the streams that touched it are past it. Called from the thread
// that enqueues the work; the streams must outlive the release.
struct Storage {
  using Release = std::function<void(void* data, const std::vector<Stream*>& uses)>;
  Storage(Device* device, void* data, std::size_t bytes, Release release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void record_use(Stream& s);
  const std::vector<Stream*>& uses() const { return uses_; }

  Device* device;
  void* data;
  std::size_t bytes;
  Release release;

 private:
  std::vector<Stream*> uses_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::shared_ptr<Storage> allocate(std::size_t bytes) = 0;
  // Bytes whose first user is stream `first_user` (not the allocator's home stream): a caching
  // allocator orders that stream after the last uses of reused bytes. Default: allocate().
  virtual std::shared_ptr<Storage> allocate_on(std::size_t bytes, Stream& first_user) { return allocate(bytes); }
  virtual Device& device() = 0;
};

// Allocates straight from Device::allocate / allocate_pinned_host (no caching, no budget beyond
// the device's capacity). A storage used on streams is freed once every one of them has passed
// the release point (Stream::retain_until_done). Tests and tools use it; training uses the
// caching allocator of memory/.
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(Device& device, bool pinned_host = false) : device_(device), pinned_host_(pinned_host) {}
  std::shared_ptr<Storage> allocate(std::size_t bytes) override;
  Device& device() override { return device_; }

 private:
  Device& device_;
  bool pinned_host_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::size_t offset_bytes = 0);

  static Tensor empty(Allocator& alloc, Shape shape, DType dtype = DType::F32);
  static Tensor empty_on(Allocator& alloc, Stream& first_user, Shape shape, DType dtype = DType::F32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const;  // negative i counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return stp::numel(shape_); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device& device() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  void record_use(Stream& s) const;  // Storage::record_use; no-op on an undefined tensor

  void* raw() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  float* f32() const;  // asserts dtype F32
  // Typed element pointer (float or bf16); asserts the tensor has that dtype.
  template <typename T>
  T* as() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw());
  }

  // A view of `shape` starting `offset` elements into this tensor (contiguous).
  Tensor view(std::int64_t offset, Shape shape) const;
  Tensor reshape(Shape shape) const;       // same numel
  void check_dtype(DType expected) const;  // asserts

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
  std::size_t offset_bytes_ = 0;
};

// Synchronous host transfers of f32 tensors (start-up, checkpoints, loss read-back, tests): the
// copy is enqueued on `s` and waited for, so the host buffer may be reused or freed on return.
std::vector<float> download(const Tensor& t, Stream& s);
void upload(const Tensor& t, const float* host, Stream& s);

}  // namespace stp
