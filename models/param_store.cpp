#include "models/param_store.h"

#include <cstring>
#include <random>

#include "base/error.h"
#include "core/kernels/nn_kernels.h"
#include "memory/block_arena.h"

namespace stp {
namespace {

using i64 = std::int64_t;

Shape shard_shape(const ParamInfo& p) {
  if (p.full_shape.size() == 1) return {p.layout.shard_cols};
  return {p.layout.shard_rows, p.layout.shard_cols};
}

}  // namespace

ShardLayout replicated_layout(i64 rows, i64 cols) {
  ShardLayout l;
  l.full_rows = l.shard_rows = rows;
  l.full_cols = l.shard_cols = cols;
  l.segments = {ShardSegment{0, 0, cols}};
  return l;
}

ShardLayout column_layout(i64 rows, const std::vector<i64>& sections, int rank, int t) {
  ShardLayout l;
  l.full_rows = l.shard_rows = rows;
  l.full_cols = l.shard_cols = 0;
  for (i64 w : sections) {
    const i64 slice = w / t;
    l.segments.push_back(ShardSegment{l.full_cols + rank * slice, l.shard_cols, slice});
    l.full_cols += w;
    l.shard_cols += slice;
  }
  return l;
}

ShardLayout row_layout(i64 rows, i64 cols, int rank, int t) {
  ShardLayout l = replicated_layout(rows, cols);
  l.shard_rows = rows / t;
  l.row_begin = rank * l.shard_rows;
  return l;
}

ShardLayout vocab_layout(i64 V, i64 C, const StageSpec& spec) {
  ShardLayout l = replicated_layout(V, C);
  if (!spec.vocab_sharded()) return l;
  l.shard_rows = vocab_rows(V, spec.tp_size);
  l.row_begin = spec.tp_rank * l.shard_rows;
  return l;
}

ParamInfo make_param(std::string name, Shape full, ShardLayout layout, bool replicated) {
  ParamInfo p;
  p.name = std::move(name);
  p.decay = full.size() >= 2;
  p.full_shape = std::move(full);
  p.replicated = replicated;
  p.layout = std::move(layout);
  return p;
}

ParamStore::ParamStore(std::vector<ParamInfo> table, DType precision, const Predicate& gemm_weight, InitRule init,
                       Allocator& device_alloc, Allocator* host_masters, const Predicate& reads_master,
                       bool shard_masters, Allocator* streamed)
    : params_(std::move(table)), init_(std::move(init)) {
  Allocator& alloc = streamed ? *streamed : device_alloc;
  const bool copies = precision != DType::F32;
  STP_ASSERT(!(host_masters && shard_masters), "ParamStore: masters go to the host or are sharded, not both");
  for (ParamInfo& p : params_) {
    const bool movable = copies && gemm_weight(p.name) && !(reads_master && reads_master(p.name));
    p.host_master = movable && host_masters;
    p.sharded_master = movable && shard_masters;
  }
  i64 total = 0, device_total = 0, host_total = 0, sharded_total = 0;
  for (const ParamInfo& p : params_) {
    const i64 n = numel(shard_shape(p));
    total += n;
    (p.host_master ? host_total : p.sharded_master ? sharded_total : device_total) += n;
  }
  {
    MaybeCategoryScope as(alloc, MemoryCategory::Weights);
    flat_params_ = Tensor::empty(alloc, {device_total});
  }
  if (host_total > 0) host_params_ = Tensor::empty(*host_masters, {host_total});
  {
    MaybeCategoryScope as(alloc, MemoryCategory::Gradients);
    flat_grads_ = Tensor::empty(alloc, {total});
  }
  if (streamed) streamed_ = {flat_params_.bytes(), flat_grads_.bytes()};
  // Gradients: the parameters with a master here in table order, then the sharded ones (the tail
  // the distributed optimizer gathers in bf16); without host masters, a device master sits at its
  // gradient's offset.
  i64 offset = 0, sharded_offset = total - sharded_total, device_offset = 0, host_offset = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ParamInfo& p = params_[i];
    Shape shape = shard_shape(p);
    p.grad = flat_grads_.view(p.sharded_master ? sharded_offset : offset, shape);
    (p.sharded_master ? sharded_offset : offset) += numel(shape);
    if (!p.sharded_master) {
      i64& at = p.host_master ? host_offset : device_offset;
      p.param = (p.host_master ? host_params_ : flat_params_).view(at, shape);
      at += numel(shape);
    }
    p.compute = p.param;
    index_[p.name] = i;
  }
  if (!copies) return;
  // bf16 copies: the sharded parameters' first (in their gradients' order), then the others.
  i64 compute_total = 0;
  for (const ParamInfo& p : params_)
    if (gemm_weight(p.name)) compute_total += numel(shard_shape(p));
  {
    MaybeCategoryScope weights(alloc, MemoryCategory::Weights);
    flat_compute_ = Tensor::empty(alloc, {compute_total}, DType::Bf16);
  }
  flat_copies_ = flat_compute_.view(0, {sharded_total});
  if (streamed) streamed_.weights += flat_compute_.bytes();
  offset = 0;
  for (bool sharded : {true, false}) {
    for (ParamInfo& p : params_) {
      if (!gemm_weight(p.name) || p.sharded_master != sharded) continue;
      p.compute = flat_compute_.view(offset, shard_shape(p));
      offset += numel(shard_shape(p));
    }
  }
}

void ParamStore::refresh_compute(Stream& s, bool host_masters) {
  for (const ParamInfo& p : params_)
    if (p.compute.dtype() == DType::Bf16 && !p.sharded_master && (host_masters || !p.host_master))
      convert(s, p.compute.as<bf16>(), p.param.f32(), p.param.numel());
}

ParamInfo& ParamStore::at(const std::string& name) {
  auto it = index_.find(name);
  STP_ASSERT(it != index_.end(), "no parameter '", name, "' in this stage");
  return params_[it->second];
}

bool ParamStore::has(const std::string& name) const { return index_.count(name) != 0; }

void ParamStore::load_full(const std::string& name, const std::vector<float>& full, Stream& s) {
  ParamInfo& p = at(name);
  STP_CHECK(static_cast<i64>(full.size()) == numel(p.full_shape), "parameter ", name, ": expected ",
            numel(p.full_shape), " values (shape ", to_string(p.full_shape), "), got ", full.size());
  std::vector<float> shard(static_cast<std::size_t>(p.grad.numel()));
  p.layout.scatter(full.data(), shard.data());
  if (!p.sharded_master) {
    upload(p.param, shard.data(), s);
    return;
  }
  // No master here: the f32 values land in the gradient (dead between steps), where the owner of
  // the masters takes its part (DistributedOptimizer::parameters_loaded); the bf16 copy is their rounding
  // (from_f32, the convert kernel's arithmetic: the bits refresh_compute would give).
  // The rounding is written over the shard from the front (value i's two bytes lie in value i / 2,
  // already read), so a load holds no buffer besides the shard.
  upload(p.grad, shard.data(), s);
  auto* rounded = reinterpret_cast<unsigned char*>(shard.data());
  for (std::size_t i = 0; i < shard.size(); ++i) {
    const bf16 b = from_f32<bf16>(shard[i]);
    std::memcpy(rounded + i * sizeof(bf16), &b, sizeof(bf16));
  }
  s.copy(p.compute.raw(), rounded, p.compute.bytes());
  s.synchronize();
}

void ParamStore::init_random(std::uint64_t seed, Stream& s) {
  for (const ParamInfo& p : params_) {
    std::vector<float> full(static_cast<std::size_t>(numel(p.full_shape)));
    const ParamInit init = init_(p.name);
    if (!init.normal) {
      std::fill(full.begin(), full.end(), static_cast<float>(init.value));
    } else {
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(p.name));
      std::normal_distribution<double> dist(0.0, init.value);
      for (float& v : full) v = static_cast<float>(dist(rng));
    }
    load_full(p.name, full, s);
  }
}

}  // namespace stp
