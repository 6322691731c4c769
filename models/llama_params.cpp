#include "models/llama_params.h"

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

// Column-parallel over sections of the given widths, each split into t equal slices.
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

bool ends_with(const std::string& s, std::string_view suffix) { return std::string_view(s).ends_with(suffix); }

}  // namespace

void llama_validate(const ModelSpec& m, const StageSpec& s) {
  STP_CHECK(m.n_layer >= 1 && m.n_head >= 1 && m.n_embd >= 1 && m.vocab_size >= 1 && m.seq_len >= 1 &&
                m.intermediate_size >= 1,
            "model: n_layer, n_head, n_embd, intermediate_size, vocab_size and seq_len must be positive");
  STP_CHECK(m.n_embd % m.n_head == 0, "model.n_embd (", m.n_embd, ") must be a multiple of model.n_head (", m.n_head,
            ")");
  STP_CHECK((m.n_embd / m.n_head) % 2 == 0, "model: the head dimension n_embd / n_head (", m.n_embd / m.n_head,
            ") must be even for rotary positions");
  STP_CHECK(m.n_kv_head >= 1 && m.n_head % m.n_kv_head == 0, "model.n_kv_head (", m.n_kv_head,
            ") must divide model.n_head (", m.n_head, ")");
  STP_CHECK(s.tp_size >= 1 && m.n_head % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.n_head (",
            m.n_head, ")");
  STP_CHECK(m.n_kv_head % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.n_kv_head (", m.n_kv_head,
            "): each tensor-parallel rank holds whole key/value heads");
  STP_CHECK(m.intermediate_size % s.tp_size == 0, "parallel.tp (", s.tp_size, ") must divide model.intermediate_size (",
            m.intermediate_size, ")");
  STP_CHECK(m.rope_theta > 0 && m.norm_eps > 0, "model.rope_theta and model.norm_eps must be positive");
  STP_CHECK(s.tp_rank >= 0 && s.tp_rank < s.tp_size, "tp rank ", s.tp_rank, " outside [0, ", s.tp_size, ")");
  STP_CHECK(0 <= s.layer_begin && s.layer_begin <= s.layer_end && s.layer_end <= m.n_layer, "stage layers [",
            s.layer_begin, ", ", s.layer_end, ") outside [0, ", m.n_layer, "]");
  STP_CHECK(s.micro_batch_size >= 1, "train.micro_batch_size must be positive, got ", s.micro_batch_size);
  STP_CHECK(m.attention == AttentionKernel::Naive || m.n_embd / m.n_head <= kMaxAttentionHeadDim,
            "model.attention: fused supports head dimensions n_embd / n_head up to ", kMaxAttentionHeadDim, ", got ",
            m.n_embd / m.n_head, "; use model.attention: naive");
}

std::string llama_head_weight(const ModelSpec& m) {
  return m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
}

std::vector<ParamInfo> llama_param_table(const ModelSpec& m, const StageSpec& s) {
  llama_validate(m, s);
  const i64 C = m.n_embd, V = m.vocab_size, D = m.n_embd / m.n_head, I = m.intermediate_size;
  const i64 QW = m.n_head * D, KW = m.n_kv_head * D;
  const int r = s.tp_rank, t = s.tp_size;
  const bool first = s.layer_begin == 0, last = s.layer_end == m.n_layer;
  std::vector<ParamInfo> out;
  auto vec = [&](const std::string& n, i64 len) {
    out.push_back(make_info(n, {len}, replicated_layout(1, len), true));
  };
  if (first || (last && m.tie_embeddings)) {
    out.push_back(make_info("model.embed_tokens.weight", {V, C}, replicated_layout(V, C), true));
    out.back().tied = m.tie_embeddings && !(first && last);
  }
  for (int i = s.layer_begin; i < s.layer_end; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".";
    vec(h + "input_layernorm.weight", C);
    out.push_back(
        make_info(h + "self_attn.qkv_proj.weight", {C, QW + 2 * KW}, column_layout(C, {QW, KW, KW}, r, t), t == 1));
    if (m.qkv_bias)
      out.push_back(
          make_info(h + "self_attn.qkv_proj.bias", {QW + 2 * KW}, column_layout(1, {QW, KW, KW}, r, t), t == 1));
    out.push_back(make_info(h + "self_attn.o_proj.weight", {QW, C}, row_layout(QW, C, r, t), t == 1));
    vec(h + "post_attention_layernorm.weight", C);
    out.push_back(make_info(h + "mlp.gate_up_proj.weight", {C, 2 * I}, column_layout(C, {I, I}, r, t), t == 1));
    out.push_back(make_info(h + "mlp.down_proj.weight", {I, C}, row_layout(I, C, r, t), t == 1));
  }
  if (last) {
    vec("model.norm.weight", C);
    if (!m.tie_embeddings) out.push_back(make_info("lm_head.weight", {V, C}, replicated_layout(V, C), true));
  }
  return out;
}

LlamaParams::LlamaParams(const ModelSpec& model, const StageSpec& spec, Allocator& alloc)
    : params_(llama_param_table(model, spec)) {
  i64 total = 0;
  for (const ParamInfo& p : params_) total += numel(shard_shape(p));
  {
    MaybeCategoryScope as(alloc, MemoryCategory::Weights);
    flat_params_ = Tensor::empty(alloc, {total});
  }
  {
    MaybeCategoryScope as(alloc, MemoryCategory::Gradients);
    flat_grads_ = Tensor::empty(alloc, {total});
  }
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
  if (model.precision == DType::F32) return;
  // bf16: the weights GEMMs multiply by get bf16 copies; the embedding only where the tied head
  // uses it (the embedding gathers rows of the f32 master).
  const bool has_head = spec.layer_end == model.n_layer;
  const std::string head = llama_head_weight(model);
  auto gemm_weight = [&](const std::string& n) {
    return ends_with(n, "qkv_proj.weight") || ends_with(n, "o_proj.weight") || ends_with(n, "gate_up_proj.weight") ||
           ends_with(n, "down_proj.weight") || (n == head && has_head);
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

void LlamaParams::refresh_compute(Stream& s) {
  for (const ParamInfo& p : params_)
    if (p.compute.dtype() == DType::BF16) convert(s, p.compute.as<bf16>(), p.param.f32(), p.param.numel());
}

ParamInfo& LlamaParams::at(const std::string& name) {
  auto it = index_.find(name);
  STP_ASSERT(it != index_.end(), "no parameter '", name, "' in this stage");
  return params_[it->second];
}

void LlamaParams::load_full(const std::string& name, const std::vector<float>& full, Stream& s) {
  ParamInfo& p = at(name);
  STP_CHECK(static_cast<i64>(full.size()) == numel(p.full_shape), "parameter ", name, ": expected ",
            numel(p.full_shape), " values (shape ", to_string(p.full_shape), "), got ", full.size());
  std::vector<float> shard(static_cast<std::size_t>(p.param.numel()));
  p.layout.scatter(full.data(), shard.data());
  upload(p.param, shard.data(), s);
}

void LlamaParams::init_random(std::uint64_t seed, Stream& s) {
  for (const ParamInfo& p : params_) {
    std::vector<float> full(static_cast<std::size_t>(numel(p.full_shape)));
    if (ends_with(p.name, "norm.weight")) {
      std::fill(full.begin(), full.end(), 1.0f);
    } else if (ends_with(p.name, ".bias")) {
      std::fill(full.begin(), full.end(), 0.0f);
    } else {
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(p.name));
      std::normal_distribution<double> dist(0.0, 0.02);
      for (float& v : full) v = static_cast<float>(dist(rng));
    }
    load_full(p.name, full, s);
  }
}

}  // namespace stp
