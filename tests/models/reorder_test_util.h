// Helpers of the tests that hold a reordered stage computation to the plain one (the chunked loss
// head, tests/models/loss_chunk_test.cpp; the tiled unit backward, tests/models/unit_tiles_test.cpp):
// one BLAS thread, their small model, seeded token ids, a record's values, and the two comparisons
// they make: losses bitwise, and each gradient bitwise or within the bound of two summation orders.
#pragma once

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/models/llama_test_util.h"

namespace stp::testing {

// One BLAS thread while a test runs: the CPU GEMM's row tiles then do not depend on a thread split
// (tests/models/loss_chunk_test.cpp says why that matters).
class OneBlasThread {
 public:
  OneBlasThread() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~OneBlasThread() { openblas_set_num_threads(saved_); }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int saved_;
};

// The small model of these tests: 2 layers, 4 heads (llama: 2 KV heads), width 32, MLP 64, and a
// vocabulary of 67 (tp 2 pads it to 68: rank 1 holds a padding row).
inline ModelSpec small_model(const char* arch, std::int64_t seq_len, DType precision) {
  ModelSpec m;
  m.arch = arch;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = std::string(arch) == "llama" ? 2 : 4;
  m.n_embd = 32;
  m.intermediate_size = 64;
  m.vocab_size = 67;
  m.seq_len = seq_len;
  m.precision = precision;
  return m;
}

// Tokens (targets false) or targets of microbatch mb: batch sequences of m.seq_len ids, seeded by
// mb. With ignore_one_in > 0, about one target in that many is then set to -1 (ignored).
inline std::vector<float> seeded_ids(const ModelSpec& m, int batch, int mb, bool targets, unsigned ignore_one_in = 0) {
  std::mt19937 rng(static_cast<unsigned>(1000 * mb + (targets ? 7 : 3)));
  std::vector<float> v(static_cast<std::size_t>(batch * m.seq_len));
  for (float& x : v) x = static_cast<float>(rng() % static_cast<unsigned>(m.vocab_size));
  if (targets && ignore_one_in > 0)
    for (std::size_t i = 0; i < v.size(); ++i)
      if (rng() % ignore_one_in == 0) v[i] = -1;
  return v;
}

// The values of unit u's record `name` for microbatch mb as f32, whatever its storage type (after
// synchronizing s, the stream that writes it). A missing record is a test failure and an empty list.
inline std::vector<float> record_values(Stage& st, int u, int mb, const std::string& name, Stream& s) {
  for (const ActivationRecord& r : st.activation_records(u, mb)) {
    if (r.name != name) continue;
    s.synchronize();
    std::vector<float> v(static_cast<std::size_t>(r.tensor.numel()));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = r.tensor.dtype() == DType::Bf16 ? to_f32(r.tensor.data<bf16>()[i]) : r.tensor.f32()[i];
    return v;
  }
  ADD_FAILURE() << "no record " << name;
  return {};
}

// Microbatch mb's tokens and targets onto every rank of g, F of every unit, then every rank's loss
// appended to losses as a new row ([mb][rank]).
inline void forward_microbatch(TpGroup& g, int mb, const std::vector<float>& tokens, const std::vector<float>& targets,
                               std::vector<std::vector<float>>& losses) {
  for (int r = 0; r < g.tp(); ++r) {
    fill_ids(g.stage(r).tokens(mb), tokens);
    fill_ids(g.stage(r).targets(mb), targets);
  }
  for (int u = 0; u < g.num_units(); ++u) g.forward(u, mb);
  losses.emplace_back();
  for (int r = 0; r < g.tp(); ++r) losses.back().push_back(host_copy(g.stage(r).loss(mb), g.compute(r))[0]);
}

// Every microbatch's losses ([mb][rank]) bitwise (memcmp) those of the plain run.
inline void expect_losses_bitwise(const std::vector<std::vector<float>>& got,
                                  const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t mb = 0; mb < want.size(); ++mb)
    EXPECT_EQ(0, std::memcmp(got[mb].data(), want[mb].data(), 4 * want[mb].size()))
        << "mb " << mb << " loss " << got[mb][0] << " vs " << want[mb][0];
}

// γ_n = n·u / (1 - n·u), u = 2^-24: any summation order of n f32 terms x_i (products fused or
// rounded once) is within γ_n·Σ|x_i| of the exact sum, so two orders are within 2·γ_n·Σ|x_i|.
inline double gamma_n(double n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

// What a gradient comparison saw: the worst difference as a fraction of its bound, and how many
// gradients were held to the bound instead of bitwise.
struct ReorderCheck {
  double worst = 0;
  int reordered = 0;
};

// Every gradient of `want` (the plain run's, by name) against `have`'s: bitwise (memcmp), or where
// terms(name) returns the Σ|x_i| of its elements (a pointer, null: bitwise), each element within
// 2·γ·Σ|x_i| of the plain one (at most five failures named per gradient). Fatal on a missing or
// differently sized gradient (wrap the call in ASSERT_NO_FATAL_FAILURE).
template <class Terms>
void expect_gradients_match(const std::map<std::string, std::vector<float>>& have,
                            const std::map<std::string, std::vector<float>>& want, double gamma, Terms terms,
                            ReorderCheck& out) {
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(have.count(name)) << name;
    const std::vector<float>& h = have.at(name);
    ASSERT_EQ(h.size(), w.size()) << name;
    const std::vector<double>* abs = terms(name);
    if (!abs) {
      EXPECT_EQ(0, std::memcmp(h.data(), w.data(), 4 * w.size())) << name << " is not bitwise";
      continue;
    }
    ++out.reordered;
    ASSERT_EQ(abs->size(), w.size()) << name;
    int over = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double diff = std::fabs(static_cast<double>(h[i]) - w[i]);
      const double bound = 2 * gamma * (*abs)[i];
      if (diff > bound && ++over <= 5) ADD_FAILURE() << name << "[" << i << "] differs by " << diff << " > " << bound;
      if (bound > 0) out.worst = std::max(out.worst, diff / bound);
    }
  }
}

}  // namespace stp::testing
