// GPT-2's registry entry: a ModelSpec becomes a GPT2Config (models/gpt2_config.h).
#include "base/error.h"
#include "models/gpt2_params.h"
#include "models/gpt2_stage.h"
#include "models/registry.h"

namespace stp {
namespace {

GPT2Config gpt2_config(const ModelSpec& m) {
  GPT2Config c;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_embd = m.n_embd;
  c.vocab_size = m.vocab_size;
  c.seq_len = m.seq_len;
  c.precision = m.precision;
  c.attention = m.attention;
  return c;
}

void gpt2_validate(const ModelSpec& m, const StageSpec& s) {
  STP_CHECK(m.tie_embeddings,
            "model.tie_embeddings: false is not supported by model.arch gpt2 (its head is the "
            "token embedding)");
  validate(gpt2_config(m), s);
}

std::vector<ParamInfo> gpt2_table(const ModelSpec& m, const StageSpec& s) {
  return gpt2_param_table(gpt2_config(m), s);
}

std::unique_ptr<Stage> gpt2_make(const ModelSpec& m, const StageSpec& s, Allocator& alloc) {
  return std::make_unique<GPT2Stage>(gpt2_config(m), s, alloc);
}

}  // namespace

const Architecture& gpt2_architecture() {
  static const Architecture a{"gpt2", &gpt2_validate, &gpt2_table, &gpt2_make};
  return a;
}

}  // namespace stp
