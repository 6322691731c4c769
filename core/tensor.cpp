#include "core/tensor.h"

#include "base/error.h"

namespace stp {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::Bf16: return 2;
  }
  throw_internal(__FILE__, __LINE__, "dtype", "unknown dtype");
}

const char* to_string(DType dtype) { return dtype == DType::F32 ? "f32" : "bf16"; }

std::int64_t numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Storage::Storage(Device* dev, void* d, std::size_t b, Release r)
    : device(dev), data(d), bytes(b), release(std::move(r)) {}

Storage::~Storage() {
  if (release) release(data, uses_);
}

void Storage::record_use(Stream& s) {
  for (Stream* u : uses_)
    if (u == &s) return;
  uses_.push_back(&s);
}

void Tensor::record_use(Stream& s) const {
  if (storage_) storage_->record_use(s);
}

std::shared_ptr<Storage> DeviceAllocator::allocate(std::size_t bytes) {
  Device* dev = &device_;
  const bool pinned = pinned_host_;
  void* p = pinned ? dev->allocate_pinned_host(bytes) : dev->allocate(bytes);
  return std::make_shared<Storage>(dev, p, bytes, [dev, pinned](void* q, const std::vector<Stream*>& uses) {
    auto free_now = [dev, pinned](void* x) { pinned ? dev->deallocate_pinned_host(x) : dev->deallocate(x); };
    if (uses.empty()) return free_now(q);
    // Freed by whichever stream passes its release point last.
    std::shared_ptr<void> holder(q, free_now);
    for (Stream* s : uses) s->retain_until_done(holder);
  });
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, std::size_t offset_bytes)
    : storage_(std::move(storage)), shape_(std::move(shape)), dtype_(dtype), offset_bytes_(offset_bytes) {
  for (auto d : shape_) STP_ASSERT(d >= 0, "negative dimension in shape ", to_string(shape_));
  STP_ASSERT(!storage_ || offset_bytes_ + bytes() <= storage_->bytes, "tensor ", to_string(shape_), " at offset ",
             offset_bytes_, " exceeds its storage of ", storage_->bytes, " bytes");
}

Tensor Tensor::empty(Allocator& alloc, Shape shape, DType dtype) {
  std::size_t bytes = static_cast<std::size_t>(stp::numel(shape)) * dtype_size(dtype);
  return Tensor(alloc.allocate(bytes), std::move(shape), dtype);
}

Tensor Tensor::empty_on(Allocator& alloc, Stream& first_user, Shape shape, DType dtype) {
  std::size_t bytes = static_cast<std::size_t>(stp::numel(shape)) * dtype_size(dtype);
  return Tensor(alloc.allocate_on(bytes, first_user), std::move(shape), dtype);
}

std::int64_t Tensor::dim(int i) const {
  int r = rank();
  if (i < 0) i += r;
  STP_ASSERT(i >= 0 && i < r, "dim ", i, " of a rank-", r, " tensor");
  return shape_[static_cast<std::size_t>(i)];
}

Device& Tensor::device() const {
  STP_ASSERT(storage_, "device() of an undefined tensor");
  return *storage_->device;
}

void* Tensor::raw() const {
  STP_ASSERT(storage_, "data of an undefined tensor");
  return static_cast<char*>(storage_->data) + offset_bytes_;
}

void Tensor::check_dtype(DType expected) const {
  STP_ASSERT(dtype_ == expected, "a ", to_string(dtype_), " tensor used as ", to_string(expected));
}

float* Tensor::f32() const {
  check_dtype(DType::F32);
  return static_cast<float*>(raw());
}

Tensor Tensor::view(std::int64_t offset, Shape shape) const {
  STP_ASSERT(offset >= 0 && offset + stp::numel(shape) <= numel(), "view [", offset, ", +", stp::numel(shape),
             ") out of a tensor of ", numel(), " elements");
  return Tensor(storage_, std::move(shape), dtype_,
                offset_bytes_ + static_cast<std::size_t>(offset) * dtype_size(dtype_));
}

Tensor Tensor::reshape(Shape shape) const {
  STP_ASSERT(stp::numel(shape) == numel(), "reshape ", to_string(shape_), " -> ", to_string(shape));
  return Tensor(storage_, std::move(shape), dtype_, offset_bytes_);
}

std::vector<float> download(const Tensor& t, Stream& s) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  s.copy(host.data(), t.f32(), t.bytes());
  s.synchronize();
  return host;
}

void upload(const Tensor& t, const float* host, Stream& s) {
  s.copy(t.f32(), host, t.bytes());
  s.synchronize();
}

}  // namespace stp
