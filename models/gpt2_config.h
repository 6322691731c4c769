// GPT-2 model shape and the part of it one stage holds (a layer range on one TP rank).
// Semantics are HF GPT-2: learned positions, pre-LayerNorm (eps 1e-5), causal attention, tanh
// GELU, final LayerNorm, LM head tied to the token embedding, mean token cross-entropy, no dropout.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "models/model_spec.h"

namespace stp {

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

// One stage of GPT-2 (models/model_spec.h): the embedding, a layer range, ln_f and the head.
using GPT2StageSpec = StageSpec;

// Throws stp::Error naming the value when the combination is invalid (tp not dividing n_head, ...).
void validate(const GPT2Config& config, const GPT2StageSpec& spec);

}  // namespace stp
