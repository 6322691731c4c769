// The cross-entropy computed in parts of rows, as the chunked loss head does
// (models/unit_common.h, lm_head_forward_chunked): cross_entropy_rows over parts of the rows and
// one mean_of_rows are bitwise cross_entropy_forward over all of them, and vocab_ce_rows over parts
// and mean_of_rows are bitwise vocab_ce_finish (core/kernels/nn_kernels.h, vocab_kernels.h): the
// same expression per row, the same canonical order for the mean. On every available device kind,
// f32 and bf16 logits, with ignored targets (-1).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/kernels/nn_kernels.h"
#include "core/kernels/vocab_kernels.h"
#include "tests/support/devices.h"

namespace stp::testing {
namespace {

using i64 = std::int64_t;
constexpr i64 kN = 40, kV = 257;
constexpr i64 kParts[] = {0, 13, 14, 40};  // part boundaries: 13 rows, 1 row, 26 rows

class CrossEntropyParts : public ::testing::TestWithParam<DeviceKind> {
 protected:
  template <typename T>
  T* upload(const std::vector<T>& host) {
    auto* p = static_cast<T*>(dev_->allocate(host.size() * sizeof(T)));
    owned_.push_back(p);
    s_->copy(p, host.data(), host.size() * sizeof(T));
    s_->synchronize();  // the copy reads `host`, which may be a temporary (zeros)
    return p;
  }
  std::vector<float> download(const float* p, i64 n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    s_->copy(v.data(), p, v.size() * sizeof(float));
    s_->synchronize();
    return v;
  }
  float* zeros(i64 n) { return upload(std::vector<float>(static_cast<std::size_t>(n), 0.0f)); }
  void TearDown() override {
    if (s_) s_->synchronize();
    for (void* p : owned_) dev_->deallocate(p);
  }
  void expect_same(const char* what, const float* a, const float* b, i64 n) {
    const std::vector<float> x = download(a, n), y = download(b, n);
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << what;
  }

  template <typename T>
  void check() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-4, 4);
    std::vector<T> logits(static_cast<std::size_t>(kN * kV));
    for (T& x : logits) x = from_f32<T>(u(rng));
    std::vector<std::int32_t> targets(static_cast<std::size_t>(kN));
    for (std::int32_t& t : targets) t = rng() % 5 == 0 ? -1 : static_cast<std::int32_t>(rng() % kV);
    const T* l = upload(logits);
    const std::int32_t* tg = upload(targets);
    Stream& s = *s_;
    // Replicated: the whole against the parts.
    float *loss = zeros(1), *losses = zeros(kN), *lse = zeros(kN);
    float *loss_p = zeros(1), *losses_p = zeros(kN), *lse_p = zeros(kN);
    cross_entropy_forward(s, loss, losses, lse, l, tg, kN, kV);
    for (int i = 0; i + 1 < 4; ++i) {
      const i64 r0 = kParts[i], n = kParts[i + 1] - r0;
      cross_entropy_rows(s, losses_p + r0, lse_p + r0, l + r0 * kV, tg + r0, n, kV);
    }
    mean_of_rows(s, loss_p, losses_p, kN);
    expect_same("losses", losses, losses_p, kN);
    expect_same("lse", lse, lse_p, kN);
    expect_same("loss", loss, loss_p, 1);
    // Vocab-parallel on one rank holding every column (no all-reduce needed): finish against rows.
    float *max = zeros(kN), *partials = zeros(2 * kN);
    vocab_ce_max(s, max, l, kN, kV, kV);
    vocab_ce_partials(s, partials, l, max, tg, kN, kV, kV, 0);
    float *vloss = zeros(1), *vlosses = zeros(kN), *vlse = zeros(kN);
    vocab_ce_finish(s, vloss, vlosses, vlse, max, partials, tg, kN);
    float *vloss_p = zeros(1), *vlosses_p = zeros(kN), *vlse_p = zeros(kN);
    for (int i = 0; i + 1 < 4; ++i) {
      const i64 r0 = kParts[i], n = kParts[i + 1] - r0;
      // A part's partials are [sum-exp | target logit] of its own n rows, as the chunked head's.
      float* part = zeros(2 * n);
      s.copy(part, partials + r0, static_cast<std::size_t>(n) * sizeof(float));
      s.copy(part + n, partials + kN + r0, static_cast<std::size_t>(n) * sizeof(float));
      vocab_ce_rows(s, vlosses_p + r0, vlse_p + r0, max + r0, part, tg + r0, n);
    }
    mean_of_rows(s, vloss_p, vlosses_p, kN);
    expect_same("vocab losses", vlosses, vlosses_p, kN);
    expect_same("vocab lse", vlse, vlse_p, kN);
    expect_same("vocab loss", vloss, vloss_p, 1);
  }

  std::unique_ptr<Device> dev_;
  std::unique_ptr<Stream> s_;
  std::vector<void*> owned_;
};

TEST_P(CrossEntropyParts, PartsAndOneMeanAreTheWholeBitwise) {
  STP_DEVICES_OR_SKIP(devices, GetParam(), 1);
  dev_ = std::move(devices[0]);
  s_ = dev_->create_stream("compute");
  check<float>();
  check<bf16>();
}

INSTANTIATE_TEST_SUITE_P(Kinds, CrossEntropyParts, ::testing::ValuesIn(all_kinds()), kind_name);

}  // namespace
}  // namespace stp::testing
