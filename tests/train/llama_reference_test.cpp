// Llama-family training against PyTorch (tools/reference/gen_llama_reference.py): the losses of 5 AdamW
// steps of the trainer (8 microbatches of 2 sequences per step, constant lr, no clipping) agree
// with the float64 reference within 1e-5 relative, for every schedule and TP x PP split: tp 1, 2
// and 4, each with all six schedules at pp 2 and the V-shaped schedules at pp 4 (8 stages of one
// layer), and tp > 1 with the vocabulary split (parallel.vocab_parallel, the default) and
// replicated. Variants: grouped-query attention with an untied head (gqa), and q/k/v biases with
// a tied head across the first and last stage (qwen2).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/models/llama_test_util.h"
#include "tests/train/reference_run.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

stp::Config llama_config(const std::string& variant, const std::vector<std::string>& extra) {
  const auto& ref = stp::testing::llama_reference(variant);
  const auto& c = ref.at("config").data;
  std::vector<std::string> sets = stp::testing::llama_reference_model_sets(ref);
  for (const std::string& s :
       stp::testing::reference_run_sets(ref, stp::testing::llama_reference_path(variant) + ".safetensors",
                                        static_cast<int>(c[7]), static_cast<int>(c[8])))
    sets.push_back(s);
  sets.push_back("output.dir=" + std::string(STP_BINARY_DIR) + "/tests/llama_reference_run");
  sets.insert(sets.end(), extra.begin(), extra.end());
  return stp::testing::tiny_config(sets);
}

struct Layout {
  const char* variant;
  const char* schedule;
  int tp, pp;
  const char* attention;
  bool vocab_parallel = true;  // parallel.vocab_parallel (its default); tp 1 ignores it
};

class LlamaTraining : public ::testing::TestWithParam<Layout> {};

TEST_P(LlamaTraining, FiveAdamWStepLossesMatchTorch) {
  const Layout l = GetParam();
  const auto& want = stp::testing::llama_reference(l.variant).at("adamw.losses").data;
  stp::testing::TrainRun run = stp::testing::run_training(
      llama_config(l.variant, {std::string("parallel.schedule=") + l.schedule, "parallel.tp=" + std::to_string(l.tp),
                               "parallel.pp=" + std::to_string(l.pp), std::string("model.attention=") + l.attention,
                               std::string("parallel.vocab_parallel=") + (l.vocab_parallel ? "true" : "false")}),
      static_cast<int>(want.size()));
  ASSERT_EQ(run.losses.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(run.losses[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
}

// The whole matrix in the release build: tp 1, 2 and 4 x all six schedules at pp 2 (and pp 1), the
// V-shaped schedules at pp 4, each tp > 1 layout with the vocabulary split and replicated. Under a
// sanitizer (about 10x slower) a cross-section of it.
std::vector<Layout> layouts() {
  const char* const schedules[] = {"gpipe", "1f1b", "1f1b-i", "zb-h1", "zb-v", "stp"};
  std::vector<Layout> full, sanitized;
  for (const char* v : {"gqa", "qwen2"}) {
    for (int tp : {1, 2, 4})
      for (bool vocab : {true, false}) {
        if (tp == 1 && !vocab) continue;  // one rank: nothing to split
        full.push_back({v, "gpipe", tp, 1, "naive", vocab});
        for (const char* s : schedules) full.push_back({v, s, tp, 2, "naive", vocab});
        for (const char* s : {"1f1b-i", "zb-v", "stp"})
          if (tp < 4 || std::string(s) == "stp") full.push_back({v, s, tp, 4, "fused", vocab});
      }
    full.push_back({v, "gpipe", 4, 1, "fused"});

    for (int tp : {1, 2, 4}) sanitized.push_back({v, "gpipe", tp, 1, "naive"});
    for (int tp : {2, 4}) sanitized.push_back({v, "gpipe", tp, 1, "naive", false});
    sanitized.push_back({v, "stp", 2, 2, "naive", false});
    sanitized.push_back({v, "gpipe", 4, 1, "fused"});
    for (const char* s : schedules) sanitized.push_back({v, s, 2, 2, "naive"});
    for (const char* s : {"1f1b-i", "zb-v", "stp"}) sanitized.push_back({v, s, 1, 4, "fused"});
  }
  return stp::testing::sweep(full, sanitized);
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  std::string s = std::string(info.param.variant) + "_" + info.param.schedule;
  for (char& c : s)
    if (c == '-') c = '_';
  return s + "_tp" + std::to_string(info.param.tp) + "_pp" + std::to_string(info.param.pp) + "_" +
         info.param.attention + (info.param.vocab_parallel ? "" : "_replicated_vocab");
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, LlamaTraining, ::testing::ValuesIn(layouts()), layout_name);

TEST(LlamaTraining, TpNotDividingKvHeadsIsAConfigError) {
  try {
    stp::Trainer t(llama_config("gqa", {"parallel.tp=8"}));  // 8 heads, 4 kv heads
    FAIL() << "tp 8 accepted with 4 kv heads";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must divide model.n_kv_head (4)"), std::string::npos) << e.what();
  }
}

}  // namespace
