// Split backward, chunks and activation records.
//   * B and W split (all B first, W deferred) == fused B/W: bitwise. Every W only reads its own
//     records and accumulates into its own parameters, so the deferral changes no arithmetic.
//   * Layers [0, L) as one chunk == chunks [0, k) + [k, L) with the hidden state handed over:
//     bitwise, loss and every gradient (the tied wte grad as the sum of the two stages' grads).
//   * Records are the only state: after F, the device holds exactly params + grads + the records
//     (+ the loss scalar); after all passes no record is left.
#include <gtest/gtest.h>

#include <set>

#include "tests/models/gpt2_test_util.h"

namespace stp::testing {
namespace {

std::map<std::string, std::vector<float>> grads_of(TpStage& ts) {
  std::map<std::string, std::vector<float>> out;
  for (ParamInfo& p : ts.stage().params()) out[p.name] = ts.full_grad(p.name);
  return out;
}

TpStage make_full(int tp = 1) {
  ModelSpec cfg = reference_config();
  return TpStage(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch()}, tp);
}

TEST(GPT2Split, DeferredWeightGradientsEqualFusedBitwise) {
  for (int tp : {1, 2}) {
    ModelSpec cfg = reference_config();
    TpStage fused(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch()}, tp);
    TpStage split(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch()}, tp);
    for (TpStage* ts : {&fused, &split}) {
      ts->load_reference_params();
      ts->zero_grads();
      feed_reference_batch(*ts, 0);
    }
    run_fused(fused, 0);
    const int U = split.num_units();
    for (int u = 0; u < U; ++u) split.forward(u, 0);
    for (int u = U - 1; u >= 0; --u) split.backward_input(u, 0);
    for (int u = U - 1; u >= 0; --u) split.backward_weight(u, 0);
    auto a = grads_of(fused), b = grads_of(split);
    for (const auto& [name, g] : a) EXPECT_EQ(g, b.at(name)) << name << " tp=" << tp;
  }
}

TEST(GPT2Split, TwoChunksEqualOneChunkBitwise) {
  ModelSpec cfg = reference_config();
  const int B = reference_batch();
  TpStage whole(cfg, StageSpec{0, cfg.n_layer, 0, 1, B}, 1);
  TpStage first(cfg, StageSpec{0, 1, 0, 1, B}, 1);
  TpStage second(cfg, StageSpec{1, cfg.n_layer, 0, 1, B}, 1);
  for (TpStage* ts : {&whole, &first, &second}) {
    ts->load_reference_params();
    ts->zero_grads();
    feed_reference_batch(*ts, 0);
  }
  EXPECT_TRUE(first.stage().is_first() && !first.stage().is_last());
  EXPECT_TRUE(!second.stage().is_first() && second.stage().is_last());
  EXPECT_TRUE(first.stage().param_store().at("wte.weight").tied);
  EXPECT_FALSE(whole.stage().param_store().at("wte.weight").tied);
  run_fused(whole, 0);

  // Forward: first chunk, hand the hidden state over, second chunk.
  for (int u = 0; u < first.num_units(); ++u) first.forward(u, 0);
  Tensor out = first.stage().output_activation(0);
  std::vector<float> h = host_copy(out, first.compute());
  std::memcpy(second.stage().input_activation(0).raw(), h.data(), 4 * h.size());
  for (int u = 0; u < second.num_units(); ++u) second.forward(u, 0);
  // Backward: second chunk, hand the gradient back, first chunk.
  for (int u = second.num_units() - 1; u >= 0; --u) {
    second.backward_input(u, 0);
    second.backward_weight(u, 0);
  }
  std::vector<float> g = host_copy(second.stage().grad_input(0), second.compute());
  std::memcpy(first.stage().grad_output(0).raw(), g.data(), 4 * g.size());
  for (int u = first.num_units() - 1; u >= 0; --u) {
    first.backward_input(u, 0);
    first.backward_weight(u, 0);
  }

  EXPECT_EQ(host_copy(whole.stage().loss(0), whole.compute()), host_copy(second.stage().loss(0), second.compute()));
  auto want = grads_of(whole), a = grads_of(first), b = grads_of(second);
  for (const auto& [name, w] : want) {
    if (name == "wte.weight") {
      // Tied: head grad (second chunk) + embedding grad (first chunk), as the executor sums them.
      std::vector<float> sum(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) sum[i] = b.at(name)[i] + a.at(name)[i];
      EXPECT_EQ(sum, w) << name;
    } else {
      EXPECT_EQ(a.count(name) ? a.at(name) : b.at(name), w) << name;
    }
  }
}

TEST(GPT2Split, RecordsAreTheOnlyStateAndAreReleased) {
  TpStage ts = make_full();
  ts.load_reference_params();
  ts.zero_grads();
  feed_reference_batch(ts, 0);
  GPT2Stage& st = ts.stage();
  Device& dev = ts.compute().device();
  for (int u = 0; u < st.num_units(); ++u) ts.forward(u, 0);
  ts.sync();

  // Device memory = params + grads + the storages the records reference + the loss scalar.
  std::set<const Storage*> storages;
  std::size_t record_bytes = 0;
  for (int u = 0; u < st.num_units(); ++u) {
    for (const ActivationRecord& r : st.activation_records(u, 0)) {
      EXPECT_EQ(r.bytes, r.tensor.bytes()) << r.name;
      EXPECT_EQ(r.name.rfind(st.unit_name(u) + ".", 0), 0u) << r.name;
      if (storages.insert(r.tensor.storage().get()).second) record_bytes += r.tensor.storage()->bytes;
    }
  }
  std::size_t params = st.param_store().flat_params().bytes() + st.param_store().flat_grads().bytes();
  EXPECT_EQ(dev.memory_stats().in_use, params + record_bytes + 4);
  EXPECT_EQ(st.live_record_bytes(), record_bytes);

  // The LayerNorm input of a TP unit is read by B of the previous unit; the attention
  // probabilities by B only; the c_attn input by W only.
  auto reader = [&](int u, const std::string& name) {
    for (const ActivationRecord& r : st.activation_records(u, 0))
      if (r.name == name) return r.reader;
    ADD_FAILURE() << "no record " << name;
    return RecordReader::B;
  };
  EXPECT_EQ(reader(1, "h.0.attn.ln.x"), RecordReader::BPrev);
  EXPECT_EQ(reader(1, "h.0.attn.att"), RecordReader::B);
  EXPECT_EQ(reader(1, "h.0.attn.ln.out"), RecordReader::W);

  // After B(u) the unit holds only what W(u) reads (plus its LayerNorm stats for B(u-1)).
  const int U = st.num_units();
  ts.backward_input(U - 1, 0);
  ts.backward_input(U - 2, 0);
  for (const ActivationRecord& r : st.activation_records(U - 2, 0))
    EXPECT_TRUE(r.reader == RecordReader::W || r.reader == RecordReader::BPrev) << r.name;
  for (int u = U - 3; u >= 0; --u) ts.backward_input(u, 0);
  for (int u = 0; u < U; ++u) ts.backward_weight(u, 0);
  EXPECT_EQ(st.live_record_bytes(), 0u);
  st.release_microbatch(0, ts.compute());
  ts.sync();
  EXPECT_EQ(dev.memory_stats().in_use, params);
}

TEST(GPT2Split, OutOfOrderPassesAreRejected) {
  TpStage ts = make_full();
  ts.zero_grads();
  feed_reference_batch(ts, 0);
  EXPECT_THROW(ts.stage().forward(1, 0, ts.compute()), InternalError);
  ts.forward(0, 0);
  EXPECT_THROW(ts.stage().backward_input(0, 0, ts.compute()), InternalError);
  EXPECT_THROW(ts.stage().backward_weight(0, 0, ts.compute()), InternalError);
}

}  // namespace
}  // namespace stp::testing
