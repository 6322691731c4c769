#include "optim/staged_comm.h"

#include <algorithm>

#include "base/error.h"
#include "memory/block_arena.h"

namespace stp {

StagedComm::StagedComm(Communicator* comm, Allocator& device_memory, int rank, int size)
    : comm_(comm), memory_(device_memory), rank_(rank), size_(size) {
  STP_ASSERT(size >= 1 && rank >= 0 && rank < size, "StagedComm: rank ", rank, " of ", size);
  STP_ASSERT(!comm || (comm->rank() == rank && comm->size() == size), "StagedComm: rank ", rank, " of ", size,
             " for a communicator's rank ", comm->rank(), " of ", comm->size());
}

Tensor StagedComm::piece(Stream& s, std::size_t count, DType dtype) {
  MaybeCategoryScope as(memory_, MemoryCategory::Buffers);
  Tensor t = Tensor::empty_on(memory_, s, Shape{static_cast<std::int64_t>(count)}, dtype);
  ++counters_.pieces;
  counters_.largest_piece_bytes = std::max(counters_.largest_piece_bytes, t.bytes());
  return t;
}

void StagedComm::up(Stream& s, void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return;
  s.copy(device, host, bytes);
  counters_.h2d_bytes += bytes;
}

void StagedComm::down(Stream& s, void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return;
  s.copy(host, device, bytes);
  counters_.d2h_bytes += bytes;
}

void StagedComm::all_reduce_sum(Stream& s, float* data, std::size_t count, std::size_t piece_count) {
  const std::size_t per = piece_count == 0 ? count : piece_count;
  for (std::size_t at = 0; at < count; at += per) {
    const std::size_t n = std::min(per, count - at);
    Tensor dev = piece(s, n, DType::F32);
    up(s, dev.raw(), data + at, n * sizeof(float));
    if (comm_) comm_->all_reduce_sum(s, dev.f32(), n);
    down(s, data + at, dev.raw(), n * sizeof(float));
    dev.record_use(s);
  }
}

void StagedComm::reduce_scatter_sum(Stream& s, float* data, std::size_t count) {
  if (count == 0) return;
  Tensor dev = piece(s, count, DType::F32);
  up(s, dev.raw(), data, count * sizeof(float));
  if (comm_) comm_->reduce_scatter_sum(s, dev.f32(), count);
  const CommSlice mine = comm_slice(count, rank_, size_);
  down(s, data + mine.first, dev.f32() + mine.first, mine.count * sizeof(float));
  dev.record_use(s);
}

void StagedComm::all_gather(Stream& s, float* data, std::size_t count) {
  if (count == 0) return;
  Tensor dev = piece(s, count, DType::F32);
  const CommSlice mine = comm_slice(count, rank_, size_);
  up(s, dev.f32() + mine.first, data + mine.first, mine.count * sizeof(float));
  if (comm_) comm_->all_gather(s, dev.f32(), count);
  down(s, data, dev.raw(), count * sizeof(float));
  dev.record_use(s);
}

void StagedComm::all_gather_bf16(Stream& s, bf16* data, std::size_t count) {
  if (count == 0) return;
  Tensor dev = piece(s, count, DType::Bf16);
  const CommSlice mine = comm_slice(count, rank_, size_);
  up(s, dev.as<bf16>() + mine.first, data + mine.first, mine.count * sizeof(bf16));
  if (comm_) comm_->all_gather_bf16(s, dev.as<bf16>(), count);
  down(s, data, dev.raw(), count * sizeof(bf16));
  dev.record_use(s);
}

}  // namespace stp
