// Model FLOPs per token (train/model_flops.h) on GPT-2 small, whose parameter count is public:
// 124,439,808 parameters, of which wpe is 1024 × 768; 6·N + 12·L·C·T as nanoGPT and PaLM count it.
#include <gtest/gtest.h>

#include "config/config.h"
#include "train/model_flops.h"

TEST(ModelFlops, Gpt2Small) {
  stp::Config c = stp::load_config_from_string("", "gpt2 small",
                                               {"model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                                "model.vocab_size=50257", "model.seq_len=1024", "data.format=u16"});
  const double n = 124439808.0 - 1024.0 * 768;  // all but wpe
  EXPECT_EQ(stp::model_flops_per_token(c), 6 * n + 12.0 * 12 * 768 * 1024);
}

// Llama-2-7B: 6,738,415,616 parameters, of which the input embedding is 32000 × 4096 (untied: a
// lookup, not counted; the head is).
TEST(ModelFlops, Llama2_7B) {
  stp::Config c = stp::load_config_from_string(
      "", "llama 7b",
      {"model.arch=llama", "model.n_layer=32", "model.n_head=32", "model.n_embd=4096", "model.intermediate_size=11008",
       "model.vocab_size=32000", "model.seq_len=4096", "data.format=u16"});
  const double n = 6738415616.0 - 32000.0 * 4096;
  EXPECT_EQ(stp::model_flops_per_token(c), 6 * n + 12.0 * 32 * 4096 * 4096);
}
