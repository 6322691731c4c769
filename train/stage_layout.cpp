#include "train/stage_layout.h"

namespace stp {

GPT2Config gpt2_config_of(const Config& config) {
  GPT2Config m;
  m.n_layer = config.model.n_layer;
  m.n_head = config.model.n_head;
  m.n_embd = config.model.n_embd;
  m.vocab_size = config.model.vocab_size;
  m.seq_len = config.model.seq_len;
  m.precision = config.train.precision == "bf16" ? DType::BF16 : DType::F32;
  m.attention = config.model.attention == "naive" ? AttentionKernel::Naive : AttentionKernel::Fused;
  return m;
}

GPT2StageSpec stage_spec_of(const Config& config, const sched::Schedule& schedule, int pp_rank, int chunk,
                            int tp_rank) {
  const int layers_per_stage = config.model.n_layer / schedule.n_stages();
  GPT2StageSpec spec;
  spec.layer_begin = schedule.stage(pp_rank, chunk) * layers_per_stage;
  spec.layer_end = spec.layer_begin + layers_per_stage;
  spec.tp_rank = tp_rank;
  spec.tp_size = config.parallel.tp;
  spec.micro_batch_size = config.train.micro_batch_size;
  return spec;
}

}  // namespace stp
