#include "models/gpt2_params.h"

#include <cmath>
#include <random>

#include "base/error.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/nn_kernels.h"
#include "memory/block_arena.h"

namespace stp {
namespace {

using i64 = std::int64_t;

ShardLayout replicated_layout(i64 rows, i64 cols) {
  ShardLayout l;
  l.full_rows = l.shard_rows = rows;
  l.full_cols = l.shard_cols = cols;
  l.segments = {ShardSegment{0, 0, cols}};
  return l;
}

// Column-parallel: `sections` equal sections of the full columns, each split into t slices.
ShardLayout column_layout(i64 rows, i64 cols, int sections, int rank, int t) {
  ShardLayout l;
  l.full_rows = l.shard_rows = rows;
  l.full_cols = cols;
  i64 section = cols / sections, slice = section / t;
  l.shard_cols = slice * sections;
  for (int k = 0; k < sections; ++k) l.segments.push_back(ShardSegment{k * section + rank * slice, k * slice, slice});
  return l;
}

ShardLayout row_layout(i64 rows, i64 cols, int rank, int t) {
  ShardLayout l = replicated_layout(rows, cols);
  l.shard_rows = rows / t;
  l.row_begin = rank * l.shard_rows;
  return l;
}

ParamInfo make_info(std::string name, Shape full, ShardLayout layout, bool replicated) {
  ParamInfo p;
  p.name = std::move(name);
  p.decay = full.size() >= 2;
  p.full_shape = std::move(full);
  p.replicated = replicated;
  p.layout = std::move(layout);
  return p;
}

Shape shard_shape(const ParamInfo& p) {
  if (p.full_shape.size() == 1) return {p.layout.shard_cols};
  return {p.layout.shard_rows, p.layout.shard_cols};
}

void add_layer(std::vector<ParamInfo>& out, int i, i64 C, int r, int t) {
  std::string h = "h." + std::to_string(i) + ".";
  auto vec = [&](const std::string& n, i64 len) {
    out.push_back(make_info(h + n, {len}, replicated_layout(1, len), true));
  };
  vec("ln_1.weight", C);
  vec("ln_1.bias", C);
  out.push_back(make_info(h + "attn.c_attn.weight", {C, 3 * C}, column_layout(C, 3 * C, 3, r, t), t == 1));
  out.push_back(make_info(h + "attn.c_attn.bias", {3 * C}, column_layout(1, 3 * C, 3, r, t), t == 1));
  out.push_back(make_info(h + "attn.c_proj.weight", {C, C}, row_layout(C, C, r, t), t == 1));
  vec("attn.c_proj.bias", C);
  vec("ln_2.weight", C);
  vec("ln_2.bias", C);
  out.push_back(make_info(h + "mlp.c_fc.weight", {C, 4 * C}, column_layout(C, 4 * C, 1, r, t), t == 1));
  out.push_back(make_info(h + "mlp.c_fc.bias", {4 * C}, column_layout(1, 4 * C, 1, r, t), t == 1));
  out.push_back(make_info(h + "mlp.c_proj.weight", {4 * C, C}, row_layout(4 * C, C, r, t), t == 1));
  vec("mlp.c_proj.bias", C);
}

}  // namespace

void validate(const GPT2Config& c, const GPT2StageSpec& s) {
  STP_CHECK(c.n_layer >= 1 && c.n_head >= 1 && c.n_embd >= 1 && c.vocab_size >= 1 && c.seq_len >= 1,
            "model: n_layer, n_head, n_embd, vocab_size and seq_len must be positive");
  STP_CHECK(c.n_embd % c.n_head == 0, "model.n_embd (", c.n_embd, ") must be a multiple of model.n_head (", c.n_head,
            ")");
  STP_CHECK(c.positions() >= c.seq_len, "model: ", c.positions(), " positions cannot hold seq_len ", c.seq_len);
  STP_CHECK(s.tp_size >= 1 && c.n_head % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.n_head (",
            c.n_head, ")");
  STP_CHECK(s.tp_rank >= 0 && s.tp_rank < s.tp_size, "tp rank ", s.tp_rank, " outside [0, ", s.tp_size, ")");
  STP_CHECK(0 <= s.layer_begin && s.layer_begin <= s.layer_end && s.layer_end <= c.n_layer, "stage layers [",
            s.layer_begin, ", ", s.layer_end, ") outside [0, ", c.n_layer, "]");
  STP_CHECK(s.micro_batch_size >= 1, "train.micro_batch_size must be positive, got ", s.micro_batch_size);
  STP_CHECK(c.attention == AttentionKernel::Naive || c.n_embd / c.n_head <= kMaxAttentionHeadDim,
            "model.attention: fused supports head dimensions n_embd / n_head up to ", kMaxAttentionHeadDim, ", got ",
            c.n_embd / c.n_head, "; use model.attention: naive");
}

std::vector<ParamInfo> gpt2_param_table(const GPT2Config& c, const GPT2StageSpec& s) {
  validate(c, s);
  const i64 C = c.n_embd;
  const bool first = s.layer_begin == 0, last = s.layer_end == c.n_layer;
  std::vector<ParamInfo> out;
  if (first || last) {
    out.push_back(make_info("wte.weight", {c.vocab_size, C}, replicated_layout(c.vocab_size, C), true));
    out.back().tied = !(first && last);
  }
  if (first) out.push_back(make_info("wpe.weight", {c.positions(), C}, replicated_layout(c.positions(), C), true));
  for (int i = s.layer_begin; i < s.layer_end; ++i) add_layer(out, i, C, s.tp_rank, s.tp_size);
  if (last) {
    out.push_back(make_info("ln_f.weight", {C}, replicated_layout(1, C), true));
    out.push_back(make_info("ln_f.bias", {C}, replicated_layout(1, C), true));
  }
  return out;
}

GPT2Params::GPT2Params(const GPT2Config& config, const GPT2StageSpec& spec, Allocator& alloc)
    : params_(gpt2_param_table(config, spec)), n_layer_(config.n_layer) {
  i64 total = 0;
  for (const ParamInfo& p : params_) total += numel(shard_shape(p));
  {
    MaybeCategoryScope as(alloc, MemoryCategory::Weights);
    flat_params_ = Tensor::empty(alloc, {total});
  }
  MaybeCategoryScope as(alloc, MemoryCategory::Gradients);
  flat_grads_ = Tensor::empty(alloc, {total});
  i64 offset = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ParamInfo& p = params_[i];
    Shape shape = shard_shape(p);
    p.param = flat_params_.view(offset, shape);
    p.grad = flat_grads_.view(offset, shape);
    p.compute = p.param;
    offset += numel(shape);
    index_[p.name] = i;
  }
  if (config.precision == DType::F32) return;
  // bf16: the weights GEMMs multiply by get bf16 copies; wte only where the LM head uses it (the
  // embedding gathers rows of the f32 master).
  const bool has_head = spec.layer_end == config.n_layer;
  auto gemm_weight = [&](const std::string& n) {
    auto ends = [&](std::string_view suffix) { return std::string_view(n).ends_with(suffix); };
    return ends("c_attn.weight") || ends("c_proj.weight") || ends("c_fc.weight") || (n == "wte.weight" && has_head);
  };
  i64 compute_total = 0;
  for (const ParamInfo& p : params_)
    if (gemm_weight(p.name)) compute_total += p.param.numel();
  {
    MaybeCategoryScope weights(alloc, MemoryCategory::Weights);
    flat_compute_ = Tensor::empty(alloc, {compute_total}, DType::BF16);
  }
  offset = 0;
  for (ParamInfo& p : params_) {
    if (!gemm_weight(p.name)) continue;
    p.compute = flat_compute_.view(offset, p.param.shape());
    offset += p.param.numel();
  }
}

void GPT2Params::refresh_compute(Stream& s) {
  for (const ParamInfo& p : params_)
    if (p.compute.dtype() == DType::BF16) convert(s, p.compute.as<bf16>(), p.param.f32(), p.param.numel());
}

ParamInfo& GPT2Params::at(const std::string& name) {
  auto it = index_.find(name);
  STP_ASSERT(it != index_.end(), "no parameter '", name, "' in this stage");
  return params_[it->second];
}

bool GPT2Params::has(const std::string& name) const { return index_.count(name) != 0; }

void GPT2Params::load_full(const std::string& name, const std::vector<float>& full, Stream& s) {
  ParamInfo& p = at(name);
  STP_CHECK(static_cast<i64>(full.size()) == numel(p.full_shape), "parameter ", name, ": expected ",
            numel(p.full_shape), " values (shape ", to_string(p.full_shape), "), got ", full.size());
  std::vector<float> shard(static_cast<std::size_t>(p.param.numel()));
  p.layout.scatter(full.data(), shard.data());
  upload(p.param, shard.data(), s);
}

void GPT2Params::init_random(std::uint64_t seed, Stream& s) {
  for (const ParamInfo& p : params_) {
    std::vector<float> full(static_cast<std::size_t>(numel(p.full_shape)));
    bool is_ln = p.name.find("ln_") != std::string::npos;
    bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    if (is_ln || is_bias) {
      std::fill(full.begin(), full.end(), is_ln && !is_bias ? 1.0f : 0.0f);
    } else {
      bool proj = p.name.find("c_proj.weight") != std::string::npos;
      double std_dev = proj ? 0.02 / std::sqrt(2.0 * n_layer_) : 0.02;
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(p.name));
      std::normal_distribution<double> dist(0.0, std_dev);
      for (float& v : full) v = static_cast<float>(dist(rng));
    }
    load_full(p.name, full, s);
  }
}

}  // namespace stp
