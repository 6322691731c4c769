// The model-independent description of a model and of the part of it one pipeline stage holds.
// Every architecture (models/registry.h) reads what it needs from a ModelSpec and ignores the
// keys that do not apply to it (GPT-2 has no rope_theta, ...).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace stp {

class Communicator;  // core/comm.h
class Allocator;     // core/tensor.h

// How a unit computes causal attention (docs/model.md, Attention). Naive keeps the (B, H, T, T)
// probabilities as a record (nn_kernels.h attention_forward); Fused keeps the output and one
// log-sum-exp per query row and recomputes the probabilities in B (core/kernels/attention_kernels.h).
// The model's default is Naive, the reference; the configuration's default (model.attention) is
// fused.
enum class AttentionKernel : std::uint8_t { Naive, Fused };

// The model keys of a configuration (config/config.h, model.*), resolved: defaults applied.
struct ModelSpec {
  std::string arch = "gpt2";  // a name of the registry (models/registry.h)
  int n_layer = 2;
  int n_head = 4;
  int n_kv_head = 4;  // key/value heads (grouped-query attention); gpt2: n_head
  int n_embd = 32;
  int intermediate_size = 128;  // MLP width (llama); gpt2 uses 4 * n_embd
  int vocab_size = 64;
  int seq_len = 16;              // T of every microbatch
  double rope_theta = 10000.0;   // llama
  double norm_eps = 1e-5;        // llama RMSNorm epsilon (gpt2's LayerNorm eps is 1e-5, fixed)
  bool qkv_bias = false;         // llama: q, k and v projections have biases (Qwen2)
  bool tie_embeddings = true;    // the LM head is the token embedding (gpt2: always)
  DType precision = DType::F32;  // activation / GEMM type; master weights are f32
  AttentionKernel attention = AttentionKernel::Naive;
};

// One stage: layers [layer_begin, layer_end) on TP rank tp_rank of tp_size. The stage with
// layer_begin == 0 owns the embedding; the one with layer_end == n_layer owns the final norm, the
// head and the loss.
struct StageSpec {
  int layer_begin = 0;
  int layer_end = 0;
  int tp_rank = 0;
  int tp_size = 1;
  int micro_batch_size = 1;  // B of every microbatch
  // Vocab parallelism (docs/model.md, Vocab parallelism): with tp_size > 1, this rank holds
  // vocab_rows(V, tp_size) rows of the embedding and of the LM head; F of the embed unit and B of
  // the head return partials for the executor's all-reduce, and the head runs its small all-reduces
  // inside the unit on vocab_comm (the TP group, a communicator of its own: the executor's
  // all-reduces use another), which must then be set before the first F.
  bool vocab_parallel = false;
  Communicator* vocab_comm = nullptr;
  bool vocab_sharded() const { return vocab_parallel && tp_size > 1; }
  // Optimizer offload at bf16 (optim/host_update.h): when set, the f32 masters of the parameters
  // that have a bf16 GEMM copy and whose master no device kernel reads are allocated from it
  // (pinned host memory) instead of the device (ParamInfo::host_master).
  Allocator* host_masters = nullptr;
  // The distributed optimizer at bf16 (optim/distributed_optimizer.h): those same parameters keep no
  // f32 master on this rank, only a bf16 copy (ParamInfo::sharded_master); the optimizer keeps the
  // masters of the parts this dp rank owns.
  bool shard_masters = false;
  // Parameter streaming (memory.param_offload, offload/param_streamer.h): when set, the flat
  // parameter, gradient and bf16 copy buffers are allocated from it (pinned host memory) instead of
  // the device; the streamer binds each unit's views to device copies for the passes that read them.
  Allocator* streamed = nullptr;
};

// Rows of the embedding and of the LM head per TP rank when vocab-parallel: V padded up to a
// multiple of tp, divided by tp.
inline std::int64_t vocab_rows(std::int64_t V, int tp) { return (V + tp - 1) / tp; }

}  // namespace stp
