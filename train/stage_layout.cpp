#include "train/stage_layout.h"

#include "models/registry.h"

namespace stp {

ModelSpec model_spec_of(const Config& config) {
  const ModelConfig& c = config.model;
  ModelSpec m;
  m.arch = c.arch;
  m.n_layer = c.n_layer;
  m.n_head = config.model.n_head;
  m.n_embd = config.model.n_embd;
  m.vocab_size = config.model.vocab_size;
  m.seq_len = config.model.seq_len;
  m.n_kv_head = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
  m.intermediate_size = c.intermediate_size > 0 ? c.intermediate_size : 4 * c.n_embd;
  m.rope_theta = c.rope_theta;
  m.norm_eps = c.norm_eps;
  m.qkv_bias = c.qkv_bias;
  m.tie_embeddings =
      c.tie_embeddings == "auto" ? find_architecture(c.arch).tie_embeddings_default : c.tie_embeddings == "true";
  m.precision = config.train.precision == "bf16" ? DType::Bf16 : DType::F32;
  m.attention = config.model.attention == "naive" ? AttentionKernel::Naive : AttentionKernel::Fused;
  return m;
}

StageSpec stage_spec_of(const Config& config, const sched::Schedule& schedule, int pp_rank, int chunk, int tp_rank) {
  const int layers_per_stage = config.model.n_layer / schedule.n_stages();
  StageSpec spec;
  spec.layer_begin = schedule.stage(pp_rank, chunk) * layers_per_stage;
  spec.layer_end = spec.layer_begin + layers_per_stage;
  spec.tp_rank = tp_rank;
  spec.tp_size = config.parallel.tp;
  spec.micro_batch_size = config.train.micro_batch_size;
  spec.vocab_parallel = config.parallel.vocab_parallel;
  return spec;
}

std::int64_t vocab_param_bytes(const Config& config, const sched::Schedule& schedule, int pp_rank) {
  const ModelSpec model = model_spec_of(config);
  std::int64_t bytes = 0;
  for (int c = 0; c < schedule.chunks; ++c)
    for (const ParamInfo& p : model_param_table(model, stage_spec_of(config, schedule, pp_rank, c, 0)))
      if (p.vocab) bytes += p.layout.shard_rows * p.layout.shard_cols * 4;
  return bytes;
}

}  // namespace stp
