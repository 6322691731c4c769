// A run whose step 2 overflows a parameter although train.lr passes validation, for the tests of
// the non-finite guard (tests/train/guard_test.cpp, tests/tools/cmd_train_test.cpp).
//
// A Llama with an untied embedding over byte-level text and model.vocab_size 300: ids 256..299
// never occur in a batch, so row 299 of model.embed_tokens.weight is read by no forward and its
// gradient is exactly zero. model.init_from sets one value of that row to 3e38, which is finite.
// With optim.weight_decay 4000, train.lr 1e-3 and two warm-up steps, AdamW's decay factor
// 1 − lr · weight_decay is −1 in step 1 (the value becomes −3e38, still finite) and −3 in step 2
// (it overflows to inf). Every other weight only changes sign, then grows threefold, so the losses
// and gradient norms of steps 1 to 3 stay finite and the guard skips nothing.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "formats/safetensors.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace stp::testing {

// The keys of the run (--set form), model.init_from and output.dir left out.
inline std::vector<std::string> overflow_overrides() {
  return {"model.arch=llama",           "model.n_layer=4",      "model.n_kv_head=2",
          "model.intermediate_size=64", "model.vocab_size=300", "model.tie_embeddings=false",
          "optim.weight_decay=4000",    "train.lr=1e-3",        "train.lr_schedule=constant",
          "train.warmup_steps=2",       "train.steps=3"};
}

// The initial parameters (stp names, the seeded init) with the unread embedding value at 3e38,
// written once per test process under a private name and renamed into place, as tiny_text_file.
inline std::string overflow_init_file() {
  static const std::string path = [] {
    const std::string p = std::string(STP_BINARY_DIR) + "/tests/overflow_init.safetensors";
    const std::string tmp = p + ".tmp." + std::to_string(::getpid());
    std::map<std::string, HostTensor> params;
    {
      Config cfg = tiny_config(overflow_overrides());
      cfg.output.dir = tmp + ".unused";  // never written
      params = Trainer(cfg).full_parameters();
    }
    HostTensor& embedding = params.at("model.embed_tokens.weight");
    embedding.data.at(static_cast<std::size_t>(299 * embedding.shape.at(1))) = 3e38f;
    std::vector<std::pair<std::string, const HostTensor*>> list;
    for (const auto& [name, t] : params) list.emplace_back(name, &t);
    write_safetensors(tmp, list);
    std::filesystem::rename(tmp, p);
    return p;
  }();
  return path;
}

// The run, with `extra` overrides (a layout, an optimizer mechanism), writing into `dir`.
inline Config overflow_config(const std::vector<std::string>& extra, const std::string& dir) {
  const std::string init = overflow_init_file();
  std::vector<std::string> sets = overflow_overrides();
  sets.insert(sets.end(), extra.begin(), extra.end());
  sets.push_back("model.init_from=" + init);
  Config cfg = tiny_config(sets);
  cfg.output.dir = dir;
  return cfg;
}

}  // namespace stp::testing
