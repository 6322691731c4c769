// Recompute (activation checkpointing), models/stage.h:
//   * Selective and Full give the losses, every parameter gradient and the input gradient of None
//     bitwise (the recompute re-runs F's kernels on F's inputs), for tp 1 and 2, two microbatches,
//     fused B/W and W deferred past the other microbatch's F and B.
//   * After F a unit holds exactly recompute_saving(u, r) fewer record bytes, and the device
//     really frees them; after B and W nothing is held.
//   * Units without a policy (embed, input, head) reject Selective/Full; the policy cannot change
//     while a microbatch holds records; cost and saving of the reference config are the numbers
//     docs/model.md lists.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "tests/models/gpt2_test_util.h"

namespace stp::testing {
namespace {

bool is_branch(const Stage& st, int u) {
  const std::string n = st.unit_name(u);
  return n.ends_with(".attn") || n.ends_with(".mlp");
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

// Two stage layouts: the whole model (embed .. head) and the chunk [1, L) (input .. head), whose
// input gradient is checked too.
enum class Layout { Whole, Tail };
enum class Order { Fused, Deferred };

struct RunResult {
  std::vector<std::vector<float>> losses, grad_inputs;
  std::map<std::string, std::vector<float>> grads;
  std::vector<std::vector<std::size_t>> held_after_f;  // [rank][unit] record bytes after F(mb 0)
};

TpStage make_stage(Layout layout, int tp, AttentionKernel attention = AttentionKernel::Naive) {
  ModelSpec cfg = reference_config();
  cfg.attention = attention;
  return TpStage(cfg, StageSpec{layout == Layout::Whole ? 0 : 1, cfg.n_layer, 0, 1, 1}, tp);
}

// Microbatch mb = row mb of the reference batch; the tail chunk gets a deterministic hidden state.
void feed(TpStage& ts, int mb) {
  feed_reference_batch(ts, mb, mb);
  for (int r = 0; r < ts.tp(); ++r) {
    GPT2Stage& st = ts.stage(r);
    if (st.is_first()) continue;
    Tensor x = st.input_activation(mb);
    float* p = x.f32();
    for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = 0.5f * std::sin(0.37f * static_cast<float>(i + 101 * mb));
  }
}

void forward_all(TpStage& ts, int mb) {
  feed(ts, mb);
  for (int u = 0; u < ts.num_units(); ++u) ts.forward(u, mb);
}

RunResult run(Layout layout, int tp, Recompute policy, Order order,
              AttentionKernel attention = AttentionKernel::Naive) {
  TpStage ts = make_stage(layout, tp, attention);
  ts.load_reference_params();
  ts.zero_grads();
  ts.set_loss_scale(0.5f);
  const int U = ts.num_units();
  for (int r = 0; r < tp; ++r)
    for (int u = 0; u < U; ++u)
      if (is_branch(ts.stage(r), u)) ts.stage(r).set_recompute(u, policy);

  RunResult out;
  auto after_first_forward = [&] {
    ts.sync();
    out.held_after_f.resize(static_cast<std::size_t>(tp));
    for (int r = 0; r < tp; ++r) {
      GPT2Stage& st = ts.stage(r);
      // The dropped records are really gone from the device: it holds params + grads + the
      // storages of the kept records + the loss scalar.
      std::set<const Storage*> storages;
      std::size_t storage_bytes = 0, held = 0;
      for (int u = 0; u < U; ++u) {
        std::size_t unit_bytes = 0;
        for (const ActivationRecord& rec : st.activation_records(u, 0)) {
          unit_bytes += rec.bytes;
          if (storages.insert(rec.tensor.storage().get()).second) storage_bytes += rec.tensor.storage()->bytes;
        }
        out.held_after_f[static_cast<std::size_t>(r)].push_back(unit_bytes);
        held += unit_bytes;
      }
      EXPECT_EQ(st.live_record_bytes(), held);
      std::size_t params = st.param_store().flat_params().bytes() + st.param_store().flat_grads().bytes();
      EXPECT_EQ(ts.compute(r).device().memory_stats().in_use, params + storage_bytes + 4)
          << to_string(policy) << " rank " << r;
    }
  };

  if (order == Order::Fused) {
    for (int mb = 0; mb < 2; ++mb) {
      forward_all(ts, mb);
      if (mb == 0) after_first_forward();
      for (int u = U - 1; u >= 0; --u) {
        ts.backward_input(u, mb);
        ts.backward_weight(u, mb);
      }
    }
  } else {
    // Both microbatches in flight; W of mb 0 deferred past F and B of mb 1.
    forward_all(ts, 0);
    after_first_forward();
    forward_all(ts, 1);
    for (int u = U - 1; u >= 0; --u) ts.backward_input(u, 0);
    for (int u = U - 1; u >= 0; --u) {
      ts.backward_input(u, 1);
      ts.backward_weight(u, 0);
    }
    for (int u = 0; u < U; ++u) ts.backward_weight(u, 1);
  }

  ts.sync();
  for (int r = 0; r < tp; ++r) EXPECT_EQ(ts.stage(r).live_record_bytes(), 0u) << to_string(policy) << " rank " << r;
  GPT2Stage& st = ts.stage();
  for (int mb = 0; mb < 2; ++mb) {
    out.losses.push_back(host_copy(st.loss(mb), ts.compute()));
    if (!st.is_first())
      for (int r = 0; r < tp; ++r) out.grad_inputs.push_back(host_copy(ts.stage(r).grad_input(mb), ts.compute(r)));
  }
  for (ParamInfo& p : st.params()) out.grads[p.name] = ts.full_grad(p.name);
  return out;
}

void expect_bitwise_equal_to_none(AttentionKernel attention) {
  for (Layout layout : {Layout::Whole, Layout::Tail}) {
    for (int tp : {1, 2}) {
      for (Order order : {Order::Fused, Order::Deferred}) {
        const RunResult none = run(layout, tp, Recompute::None, order, attention);
        EXPECT_EQ(none.losses.size(), 2u);
        EXPECT_EQ(none.grad_inputs.size(), layout == Layout::Tail ? 2u * static_cast<std::size_t>(tp) : 0u);
        TpStage probe = make_stage(layout, tp, attention);
        for (Recompute policy : {Recompute::Selective, Recompute::Full}) {
          const std::string what = std::string(to_string(policy)) + " tp=" + std::to_string(tp) +
                                   (layout == Layout::Whole ? " whole" : " tail") +
                                   (order == Order::Fused ? " fused" : " deferred");
          const RunResult rc = run(layout, tp, policy, order, attention);
          for (std::size_t i = 0; i < none.losses.size(); ++i)
            EXPECT_TRUE(bitwise_equal(rc.losses[i], none.losses[i])) << what << " loss " << i;
          for (std::size_t i = 0; i < none.grad_inputs.size(); ++i)
            EXPECT_TRUE(bitwise_equal(rc.grad_inputs[i], none.grad_inputs[i])) << what << " grad_input " << i;
          EXPECT_EQ(rc.grads.size(), none.grads.size());
          for (const auto& [name, g] : none.grads)
            EXPECT_TRUE(bitwise_equal(rc.grads.at(name), g)) << what << " " << name;

          std::size_t dropped = 0;
          for (int r = 0; r < tp; ++r) {
            for (int u = 0; u < probe.num_units(); ++u) {
              const std::size_t saving = probe.stage(r).recompute_saving(u, policy);
              EXPECT_EQ(saving > 0, is_branch(probe.stage(r), u)) << what << " unit " << u;
              const std::size_t ru = static_cast<std::size_t>(r), uu = static_cast<std::size_t>(u);
              EXPECT_EQ(rc.held_after_f[ru][uu] + saving, none.held_after_f[ru][uu]) << what << " unit " << u;
              dropped += saving;
            }
          }
          EXPECT_GT(dropped, 0u) << what;
        }
      }
    }
  }
}

TEST(GPT2Recompute, BitwiseEqualToNoneAndHoldsExactlyTheSavingLess) {
  expect_bitwise_equal_to_none(AttentionKernel::Naive);
}

// The same with fused attention, whose Selective drops ln.out, the log-sum-exp and y and re-runs
// LayerNorm and the fused forward (docs/model.md, Recompute).
TEST(GPT2Recompute, FusedAttentionBitwiseEqualToNoneAndHoldsExactlyTheSavingLess) {
  expect_bitwise_equal_to_none(AttentionKernel::Fused);
}

TEST(GPT2Recompute, FullKeepsOnlyTheUnitInputAndBRestoresTheRecords) {
  TpStage none = make_stage(Layout::Whole, 1), full = make_stage(Layout::Whole, 1);
  for (TpStage* ts : {&none, &full}) {
    ts->load_reference_params();
    ts->zero_grads();
  }
  const int U = full.num_units(), attn = 1, mlp = 2;
  for (int u = 0; u < U; ++u)
    if (is_branch(full.stage(), u)) full.stage().set_recompute(u, Recompute::Full);
  EXPECT_EQ(full.stage().recompute(attn), Recompute::Full);
  EXPECT_EQ(full.stage().recompute(0), Recompute::None);
  for (TpStage* ts : {&none, &full}) forward_all(*ts, 0);
  for (int u : {attn, mlp}) {
    std::vector<ActivationRecord> recs = full.stage().activation_records(u, 0);
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].name, full.stage().unit_name(u) + ".ln.x");
  }
  // B of the last MLP unit regenerates its records: after it the unit holds what None holds
  // (same names, readers, sizes), W's records and the LayerNorm statistics for B(u-1).
  auto summary = [](const std::vector<ActivationRecord>& recs) {
    std::set<std::tuple<std::string, RecordReader, std::size_t, char>> s;
    for (const ActivationRecord& r : recs) s.insert({r.name, r.reader, r.bytes, r.saved_by});
    return s;
  };
  for (TpStage* ts : {&none, &full}) {
    ts->backward_input(U - 1, 0);
    ts->backward_input(U - 2, 0);
  }
  EXPECT_EQ(summary(full.stage().activation_records(U - 2, 0)), summary(none.stage().activation_records(U - 2, 0)));
  // The units whose B has not run yet still hold only their input.
  std::size_t not_yet_restored = 0;
  for (int u = 0; u < U - 2; ++u) not_yet_restored += full.stage().recompute_saving(u, Recompute::Full);
  EXPECT_GT(not_yet_restored, 0u);
  EXPECT_EQ(full.stage().live_record_bytes() + not_yet_restored, none.stage().live_record_bytes());
}

TEST(GPT2Recompute, OnlyAttentionAndMlpUnitsAcceptAPolicyAndOnlyBetweenSteps) {
  TpStage whole = make_stage(Layout::Whole, 1), tail = make_stage(Layout::Tail, 1);
  GPT2Stage& st = whole.stage();
  const int head = st.num_units() - 1;
  for (Recompute r : {Recompute::Selective, Recompute::Full}) {
    EXPECT_THROW(st.set_recompute(0, r), Error);            // embed
    EXPECT_THROW(st.set_recompute(head, r), Error);         // head
    EXPECT_THROW(tail.stage().set_recompute(0, r), Error);  // input
  }
  EXPECT_NO_THROW(st.set_recompute(head, Recompute::None));
  EXPECT_EQ(st.recompute(head), Recompute::None);
  EXPECT_THROW(st.set_recompute(st.num_units(), Recompute::None), Error);

  // Not while a microbatch holds records of the unit; fine again once it is done.
  whole.load_reference_params();
  whole.zero_grads();
  forward_all(whole, 0);
  EXPECT_THROW(st.set_recompute(1, Recompute::Full), Error);
  for (int u = st.num_units() - 1; u >= 0; --u) {
    whole.backward_input(u, 0);
    whole.backward_weight(u, 0);
  }
  EXPECT_NO_THROW(st.set_recompute(1, Recompute::Full));
  EXPECT_EQ(st.recompute(1), Recompute::Full);
}

TEST(GPT2Recompute, CostAndSavingOfTheReferenceConfig) {
  ModelSpec cfg = reference_config();
  for (int tp : {1, 2}) {
    TpStage ts(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch()}, tp);
    GPT2Stage& st = ts.stage();
    for (int u = 0; u < st.num_units(); ++u) {
      const double none = st.recompute_cost(u, Recompute::None), sel = st.recompute_cost(u, Recompute::Selective),
                   full = st.recompute_cost(u, Recompute::Full);
      EXPECT_EQ(none, 0.0);
      EXPECT_EQ(st.recompute_saving(u, Recompute::None), 0u);
      if (is_branch(st, u)) {
        EXPECT_LT(none, sel) << st.unit_name(u);
        EXPECT_LT(sel, full) << st.unit_name(u);
        EXPECT_LE(full, 1.0) << st.unit_name(u);
        EXPECT_LT(st.recompute_saving(u, Recompute::Selective), st.recompute_saving(u, Recompute::Full));
      } else {
        EXPECT_EQ(sel, 0.0);
        EXPECT_EQ(full, 0.0);
        EXPECT_EQ(st.recompute_saving(u, Recompute::Full), 0u);
      }
    }
  }
  // The numbers of docs/model.md (tp 1, B 2, T 16, C 32, H 4).
  TpStage ts(cfg, StageSpec{0, cfg.n_layer, 0, 1, reference_batch()}, 1);
  GPT2Stage& st = ts.stage();
  EXPECT_EQ(st.recompute_saving(1, Recompute::Selective), 16384u);
  EXPECT_EQ(st.recompute_saving(1, Recompute::Full), 28928u);
  EXPECT_EQ(st.recompute_saving(2, Recompute::Selective), 20480u);
  EXPECT_EQ(st.recompute_saving(2, Recompute::Full), 37120u);
  EXPECT_DOUBLE_EQ(st.recompute_cost(1, Recompute::Selective), 83968.0 / 346112.0);
  EXPECT_DOUBLE_EQ(st.recompute_cost(1, Recompute::Full), 280576.0 / 346112.0);
  EXPECT_DOUBLE_EQ(st.recompute_cost(2, Recompute::Selective), 45056.0 / 569344.0);
  EXPECT_DOUBLE_EQ(st.recompute_cost(2, Recompute::Full), 307200.0 / 569344.0);
  // ... and the bytes a layer's units hold after F without recompute.
  ts.load_reference_params();
  ts.zero_grads();
  feed_reference_batch(ts, 0);
  for (int u = 0; u < st.num_units(); ++u) ts.forward(u, 0);
  auto held = [&](int u) {
    std::size_t b = 0;
    for (const ActivationRecord& r : st.activation_records(u, 0)) b += r.bytes;
    return b;
  };
  EXPECT_EQ(held(1), 33024u);
  EXPECT_EQ(held(2), 41216u);
}

}  // namespace
}  // namespace stp::testing
