// The trainer config of a float64 reference file's AdamW run (tools/reference/gen_llama_reference.py,
// and gen_gpt2_reference.py's masked_reference): its model keys, its data (the u16 tokens64_file(),
// sequential) and its optimizer, shared by the tests that train against a reference.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "tests/models/llama_test_util.h"
#include "tests/train/train_fixture.h"

namespace stp::testing {

// A double as --set writes it back exactly.
inline std::string exact(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// The model keys of a llama reference's "config" tensor (layout in gen_llama_reference.py).
inline std::vector<std::string> llama_reference_model_sets(const RefFile& ref) {
  const auto& c = ref.at("config").data;
  auto i = [](float v) { return std::to_string(static_cast<int>(v)); };
  return {"model.arch=llama",
          "model.n_layer=" + i(c[0]),
          "model.n_head=" + i(c[1]),
          "model.n_kv_head=" + i(c[2]),
          "model.n_embd=" + i(c[3]),
          "model.intermediate_size=" + i(c[4]),
          "model.vocab_size=" + i(c[5]),
          "model.seq_len=" + i(c[6]),
          "model.rope_theta=" + exact(c[9]),
          "model.norm_eps=" + exact(c[10]),
          std::string("model.qkv_bias=") + (c[11] != 0 ? "true" : "false"),
          std::string("model.tie_embeddings=") + (c[12] != 0 ? "true" : "false")};
}

// The rest of the reference's run: naive attention, its initial parameters (`init_from`), the
// reference tokens read in order, `batch` x `microbatches` sequences a step, constant lr, no
// clipping, the reference's AdamW hyperparameters ("adamw.hyper").
inline std::vector<std::string> reference_run_sets(const RefFile& ref, const std::string& init_from, int batch,
                                                   int microbatches) {
  const auto& h = ref.at("adamw.hyper").data;
  return {"model.attention=naive",
          "model.init_from=" + init_from,
          "data.format=u16",
          "data.path=" + tokens64_file(),
          "data.sampling=sequential",
          "train.micro_batch_size=" + std::to_string(batch),
          "train.microbatches=" + std::to_string(microbatches),
          "train.lr=" + exact(h[0]),
          "train.lr_schedule=constant",
          "train.warmup_steps=0",
          "train.grad_clip=0",
          "optim.beta1=" + exact(h[1]),
          "optim.beta2=" + exact(h[2]),
          "optim.eps=" + exact(h[3]),
          "optim.weight_decay=" + exact(h[4])};
}

}  // namespace stp::testing
