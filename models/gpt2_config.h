// GPT-2 model shape and the part of it one stage holds (a layer range on one TP rank).
// Semantics are HF GPT-2: learned positions, pre-LayerNorm (eps 1e-5), causal attention, tanh
// GELU, final LayerNorm, LM head tied to the token embedding, mean token cross-entropy, no dropout.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace stp {

// How a unit computes causal attention (docs/model.md, Attention). Naive keeps the (B, H, T, T)
// probabilities as a record (nn_kernels.h attention_forward); Fused keeps the output and one
// log-sum-exp per query row and recomputes the probabilities in B (core/kernels/attention_kernels.h).
// The model's default is Naive, the reference; the configuration's default (model.attention) is
// fused.
enum class AttentionKernel : std::uint8_t { Naive, Fused };

struct GPT2Config {
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 32;
  int vocab_size = 64;
  int seq_len = 16;              // T of every microbatch
  int n_positions = 0;           // rows of wpe; 0 = seq_len
  DType precision = DType::F32;  // activation / GEMM type (GPT2Dims::act); master weights are f32
  AttentionKernel attention = AttentionKernel::Naive;
  int positions() const { return n_positions > 0 ? n_positions : seq_len; }
};

// One stage: layers [layer_begin, layer_end) on TP rank tp_rank of tp_size. The stage with
// layer_begin == 0 owns the embedding; the one with layer_end == n_layer owns ln_f, head and loss.
struct GPT2StageSpec {
  int layer_begin = 0;
  int layer_end = 0;
  int tp_rank = 0;
  int tp_size = 1;
  int micro_batch_size = 1;  // B of every microbatch
};

// Throws stp::Error naming the value when the combination is invalid (tp not dividing n_head, ...).
void validate(const GPT2Config& config, const GPT2StageSpec& spec);

}  // namespace stp
