// ParamStore: the parameters of one stage on one device, for any architecture. The architecture
// gives its parameter table (names, full shapes, flags, shard layouts: the helpers below build the
// layouts), which of them GEMMs multiply by, and its init rule; the store holds one flat device
// buffer each for parameters and gradients (zeroing grads is one memset; each ParamInfo views its
// slice, in table order, sharded masters' gradients last) and, at bf16 precision, the bf16 copies
// of the GEMM weights.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/model_spec.h"
#include "models/stage.h"

namespace stp {

// ---- shard layouts (models/stage.h, ShardLayout) ---------------------------------------------------
// Every rank holds the full rows x cols tensor.
ShardLayout replicated_layout(std::int64_t rows, std::int64_t cols);
// Column-parallel over consecutive sections of the given widths, each split into t equal slices:
// rank r holds slice r of every section, laid out [section 0 | section 1 | ...].
ShardLayout column_layout(std::int64_t rows, const std::vector<std::int64_t>& sections, int rank, int t);
// Row-parallel: rank r holds rows [r * rows/t, (r+1) * rows/t).
ShardLayout row_layout(std::int64_t rows, std::int64_t cols, int rank, int t);
// The embedding or LM head (V, C) of a stage: replicated, or (spec.vocab_sharded()) rank r holding
// rows [r * Vs, (r+1) * Vs) of V padded to tp * Vs (Vs = vocab_rows(V, tp)); the padding rows
// are zero and map to no row of the full tensor.
ShardLayout vocab_layout(std::int64_t V, std::int64_t C, const StageSpec& spec);
// A table entry; decay is on for tensors of two or more dimensions.
ParamInfo make_param(std::string name, Shape full, ShardLayout layout, bool replicated);

// How init_random fills one full tensor: a constant, or normal(0, std) draws.
struct ParamInit {
  bool normal = false;
  double value = 0.0;  // the constant, or the standard deviation
};

class ParamStore {
 public:
  using Predicate = std::function<bool(const std::string& name)>;
  using InitRule = std::function<ParamInit(const std::string& name)>;

  // table: the stage's parameters (param/grad undefined). precision: the GEMM type; at bf16 the
  // parameters `gemm_weight` selects get bf16 copies (ParamInfo::compute), the others compute from
  // their f32 master. host_masters (bf16 only; optimizer offload): the masters of the copied
  // parameters that `reads_master` does not name (a device kernel reads their f32 master, e.g. the
  // embedding gather) are allocated from it instead of `alloc` (ParamInfo::host_master); the
  // device then holds only their bf16 copies.
  // shard_masters (bf16 only; the distributed optimizer, StageSpec::shard_masters): those same
  // parameters get no f32 master here (ParamInfo::sharded_master); their gradients form the tail
  // of flat_grads() and their bf16 copies flat_copies(), in the same order, so that the dp ranks
  // owning parts of the masters (optim/distributed_optimizer.h) all-gather the copies bucket by bucket.
  // streamed (parameter streaming, StageSpec::streamed): the flat parameter, gradient and copy
  // buffers come from it (pinned host memory) instead of `alloc`; streamed_bytes() says how many.
  ParamStore(std::vector<ParamInfo> table, DType precision, const Predicate& gemm_weight, InitRule init,
             Allocator& alloc, Allocator* host_masters = nullptr, const Predicate& reads_master = {},
             bool shard_masters = false, Allocator* streamed = nullptr);

  std::vector<ParamInfo>& list() { return params_; }
  ParamInfo& at(const std::string& name);  // asserts the name exists
  bool has(const std::string& name) const;
  // The device masters (all of them unless some are host_master, which are not in it).
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  // The bf16 copies of the sharded_master parameters: element i is the copy of element
  // flat_params().numel() + i of flat_grads() (empty without shard_masters).
  const Tensor& flat_copies() const { return flat_copies_; }

  // Seeded init: each full tensor is filled by the init rule, normal draws from their own stream
  // keyed by (seed, name), and then sharded, so every TP and PP split sees the same model.
  // Synchronizes s.
  void init_random(std::uint64_t seed, Stream& s);
  // Copies a full host tensor (the layout of ParamInfo::full_shape) into this rank's shard; for a
  // sharded_master parameter, the f32 shard into its gradient (the optimizer adopts its part from
  // there) and its bf16 rounding into the copy. Synchronizes s. Holds one host buffer besides
  // `full`: the shard's f32 values (p.grad.numel() of them; the rounding is written over them).
  void load_full(const std::string& name, const std::vector<float>& full, Stream& s);
  // Rounds the f32 masters into their bf16 GEMM copies, in stream order on s; no-op at f32
  // precision, where `compute` is the master itself. The stage calls it in zero_grads, at the start
  // of every step, so loads and optimizer steps before it are seen. host_masters = false skips the
  // host_master parameters (their copies were uploaded by the offloaded optimizer); with true their
  // conversion is a device kernel reading pinned host memory (mapped: legal on CUDA too).
  void refresh_compute(Stream& s, bool host_masters = true);
  // Pinned host bytes of the streamed flat buffers (weights: parameters and bf16 copies); zero
  // unless the store was built with `streamed`.
  StreamedBytes streamed_bytes() const { return streamed_; }

 private:
  std::vector<ParamInfo> params_;
  InitRule init_;
  std::map<std::string, std::size_t> index_;
  Tensor flat_params_, flat_grads_;
  Tensor host_params_;   // the host_master parameters' f32 masters (pinned host memory)
  Tensor flat_compute_;  // bf16 copies of the GEMM weights (bf16 precision only)
  Tensor flat_copies_;   // its head: the sharded_master parameters' copies
  StreamedBytes streamed_;
};

}  // namespace stp
