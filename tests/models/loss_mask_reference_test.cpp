// Masked loss against PyTorch (float64 reference; tools/reference/gen_gpt2_reference.py,
// masked_reference, and tools/reference/gen_llama_reference.py, variant "masked"): one microbatch
// whose targets a loss mask leaves partly out (-1, data/data.h). Its loss and every parameter
// gradient match torch's cross_entropy(ignore_index=-1) mean, for gpt2 (tied head) and llama
// (untied head), on 1 and 2 TP ranks with the vocabulary replicated and (tp 2) vocab-parallel, with
// the unchunked loss head and with the chunked one (Stage::set_loss_chunk_tokens) at chunk sizes
// that do not divide B·T: the chunked head's rows are not always bitwise the unchunked ones (the
// CPU GEMM's row results depend on the row's place in its tiles), so it is held to the reference
// at the same tolerance (tests/models/loss_chunk_test.cpp checks it bitwise where the tiles agree).
//
// The stage's loss(mb) is the sum over its B·T positions / (B·T), an ignored target adding 0, and
// its seed per counted target is loss_scale / (B·T) (models/stage.h, loss): with loss_scale =
// B·T / C for the C counted targets, loss · B·T / C is the masked mean and the gradients are its
// gradients. Tolerance: 1e-5 relative to each tensor's scale, as the unmasked reference tests
// (rounding only).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/models/llama_test_util.h"

namespace stp::testing {
namespace {

constexpr double kTol = 1e-5;

const RefFile& masked_reference(const std::string& arch) {
  static std::map<std::string, RefFile> cache;
  auto it = cache.find(arch);
  if (it == cache.end()) {
    const std::string name = arch == "gpt2" ? "gpt2_masked_ref" : "llama_masked_ref";
    it = cache.emplace(arch, read_reference(std::string(STP_SOURCE_DIR) + "/tests/models/data/" + name + ".bin")).first;
  }
  return it->second;
}

// The model of a masked reference (config layouts in the generators' docstrings).
ModelSpec masked_model(const std::string& arch) {
  const RefFile& ref = masked_reference(arch);
  if (arch == "llama") return llama_reference_model(ref);
  const auto& c = ref.at("config").data;
  ModelSpec m;
  m.arch = "gpt2";
  m.n_layer = static_cast<int>(c[0]);
  m.n_head = static_cast<int>(c[1]);
  m.n_kv_head = m.n_head;
  m.n_embd = static_cast<int>(c[2]);
  m.vocab_size = static_cast<int>(c[3]);
  m.seq_len = static_cast<int>(c[4]);
  return m;
}

int masked_batch(const std::string& arch) {
  return static_cast<int>(masked_reference(arch).at("config").data[arch == "gpt2" ? 5 : 7]);
}

struct Case {
  const char* arch;
  int tp;
  bool vocab_parallel;
  std::int64_t loss_chunk = 0;  // 0: the unchunked head
};

class MaskedLossReference : public ::testing::TestWithParam<Case> {};

TEST_P(MaskedLossReference, LossAndGradientsMatchTorchIgnoreIndex) {
  const Case c = GetParam();
  const RefFile& ref = masked_reference(c.arch);
  const ModelSpec model = masked_model(c.arch);
  StageSpec spec{0, model.n_layer, 0, c.tp, masked_batch(c.arch)};
  spec.vocab_parallel = c.vocab_parallel;
  TpGroup g(model, spec, c.tp);
  for (int r = 0; r < c.tp; ++r) g.stage(r).set_loss_chunk_tokens(c.loss_chunk);
  g.load(ref);
  g.zero_grads();
  g.feed(ref, 0);
  const std::vector<float>& targets = ref.at("targets").data;
  const auto positions = static_cast<double>(targets.size());
  double counted = 0;
  for (float t : targets) counted += t >= 0 ? 1 : 0;
  ASSERT_GT(counted, 0);
  ASSERT_LT(counted, positions) << "the reference batch masks some targets";
  g.set_loss_scale(static_cast<float>(positions / counted));
  for (int u = 0; u < g.num_units(); ++u) g.forward(u, 0);
  const double want = ref.at("loss").data[0];
  double worst = 0;
  for (int r = 0; r < g.tp(); ++r) {
    const double loss = host_copy(g.stage(r).loss(0), g.compute(r))[0] * positions / counted;
    EXPECT_NEAR(loss, want, kTol * want) << "rank " << r;
    worst = std::max(worst, std::fabs(loss - want) / want);
  }
  for (int u = g.num_units() - 1; u >= 0; --u) {
    g.backward_input(u, 0);
    g.backward_weight(u, 0);
  }
  int compared = 0;
  for (ParamInfo& p : g.stage().params()) {
    const double err = scaled_error(g.full_grad(p.name), ref.at("grad." + p.name).data);
    EXPECT_LT(err, kTol) << p.name;
    worst = std::max(worst, err);
    ++compared;
  }
  int want_compared = 0;
  for (const auto& [name, t] : ref) want_compared += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, want_compared) << "every reference gradient is compared";
  std::printf("[ masked %s tp %d%s loss chunk %lld ] worst relative error of the loss and gradients %.2e\n", c.arch,
              c.tp, c.vocab_parallel ? " vocab-parallel" : "", static_cast<long long>(c.loss_chunk), worst);
}

INSTANTIATE_TEST_SUITE_P(Splits, MaskedLossReference,
                         ::testing::Values(Case{"gpt2", 1, false}, Case{"gpt2", 2, false}, Case{"gpt2", 2, true},
                                           Case{"llama", 1, false}, Case{"llama", 2, false}, Case{"llama", 2, true},
                                           Case{"gpt2", 1, false, 5}, Case{"gpt2", 2, false, 1},
                                           Case{"gpt2", 2, true, 7}, Case{"llama", 1, false, 5},
                                           Case{"llama", 2, false, 1}, Case{"llama", 2, true, 7}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.arch) + "_tp" + std::to_string(i.param.tp) +
                                  (i.param.vocab_parallel ? "_vocab" : "") +
                                  (i.param.loss_chunk ? "_chunk" + std::to_string(i.param.loss_chunk) : "");
                         });

}  // namespace
}  // namespace stp::testing
