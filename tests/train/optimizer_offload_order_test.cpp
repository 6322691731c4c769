// memory.optimizer_offload and parallel.distributed_optimizer: where the next step waits for the
// updated parameters, read back from the trace (output.trace: true) of a zb-v run (two chunks per
// rank):
//   * in step 2, compute waits for each chunk's upload exactly once, in a "params chunk c" span
//     that comes right before the first op of step 2 running a part of chunk c (no op of chunk c
//     before it): the wait sits at the chunk's first use, not at the end of step 1;
//   * the wait for the chunk whose first op comes later in the op list comes after an op of the
//     other chunk: the step starts computing before every upload is waited for;
//   * every such wait ends after the upload it waits for ("upload group c" on the optimizer-h2d
//     stream, step 1), so the order is real, not only the enqueueing;
//   * that upload starts after the CPU update of its group ends ("update group c" on the
//     optimizer-cpu stream, step 1), and the CPU updates run in group order;
//   * with the distributed optimizer, the same waits are for each chunk's all-gathers of step 1
//     ("AG dp chunk c ..." on the dp-comm stream);
//   * with memory.optimizer_overlap, a chunk's speculative update ("speculative update group c" on
//     the optimizer-cpu stream) ends before the step's last op on compute, and is committed.
// Timing-free: the assertions are about stream order (each stream runs its work in order on the
// CPU backend), not about how long anything took.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/trace.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

struct Span {
  std::string name, cat;
  int chunk = -1;  // "chunk" or "group" argument, else -1
  double begin, end;
};

std::vector<Span> spans_of(const stp::TraceRecorder& rec, int pid, const std::string& tid) {
  std::vector<Span> out;
  for (const auto& s : rec.spans()) {
    if (s.pid != pid || s.tid != tid) continue;
    Span x{s.name, s.category, -1, s.ts_us, s.ts_us + s.dur_us};
    if (!s.args.empty()) {
      auto args = nlohmann::json::parse(s.args.json());
      if (args.contains("chunk")) x.chunk = args.at("chunk").get<int>();
      if (args.contains("group")) x.chunk = args.at("group").get<int>();
    }
    out.push_back(std::move(x));
  }
  std::stable_sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  return out;
}

const Span& named(const std::vector<Span>& spans, const std::string& name) {
  auto it = std::find_if(spans.begin(), spans.end(), [&](const Span& s) { return s.name == name; });
  if (it == spans.end()) throw std::runtime_error("no span " + name);
  return *it;
}

// The local chunks an op span ("F0.1", "F0.1&B1.2", ...) runs parts of: the digit after each pass
// letter. Ops carry no chunk argument, so read the label.
std::vector<int> chunks_of_op(const std::string& op) {
  std::vector<int> out;
  for (std::size_t i = 0; i + 1 < op.size(); ++i)
    if ((op[i] == 'F' || op[i] == 'B' || op[i] == 'W') && std::isdigit(static_cast<unsigned char>(op[i + 1])))
      out.push_back(op[i + 1] - '0');
  return out;
}

// Step 2's spans on compute (within "step 2", not the step span itself), in order.
std::vector<Span> step2_spans(const std::vector<Span>& compute) {
  const Span& step2 = named(compute, "step 2");
  std::vector<Span> in2;
  for (const Span& s : compute)
    if (s.begin >= step2.begin && s.end <= step2.end && s.cat != "step") in2.push_back(s);
  return in2;
}

// The common checks: in step 2 each of the two chunks waits once, right before its first op, and
// not before awaited_end[c] (the end of what it waits for); the later chunk's wait follows an op of
// the other chunk.
void expect_waits_at_first_use(const std::vector<Span>& in2, const std::vector<double>& awaited_end) {
  std::vector<std::size_t> first_op_of(2, in2.size()), wait_at(2, in2.size());
  for (std::size_t i = 0; i < in2.size(); ++i) {
    const Span& s = in2[i];
    if (s.cat == "params") {
      ASSERT_GE(s.chunk, 0);
      EXPECT_EQ(wait_at[static_cast<std::size_t>(s.chunk)], in2.size()) << "chunk " << s.chunk << " waited twice";
      wait_at[static_cast<std::size_t>(s.chunk)] = i;
    }
    if (s.cat == "op")
      for (int c : chunks_of_op(s.name))
        first_op_of[static_cast<std::size_t>(c)] = std::min(first_op_of[static_cast<std::size_t>(c)], i);
  }
  for (std::size_t c = 0; c < 2; ++c) {
    SCOPED_TRACE("chunk " + std::to_string(c));
    ASSERT_LT(wait_at[c], in2.size()) << "step 2 never waits for the chunk's parameters";
    ASSERT_LT(first_op_of[c], in2.size());
    // Right before the first op of the chunk: the next op span is it (units of an op nest inside).
    std::size_t next_op = wait_at[c] + 1;
    while (next_op < in2.size() && in2[next_op].cat != "op") ++next_op;
    EXPECT_EQ(next_op, first_op_of[c]) << in2[wait_at[c]].name << " is followed by "
                                       << (next_op < in2.size() ? in2[next_op].name : "nothing");
    EXPECT_GE(in2[wait_at[c]].end, awaited_end[c]);
  }
  // The later chunk's wait follows compute of the other chunk in step 2.
  const std::size_t later = first_op_of[0] < first_op_of[1] ? 1 : 0;
  EXPECT_GT(wait_at[later], first_op_of[1 - later]);
}

TEST(OptimizerOffloadOrder, EachChunkWaitsForItsUploadRightBeforeItsFirstOpOfTheNextStep) {
  stp::Trainer t(stp::testing::tiny_config(
      {"parallel.schedule=zb-v", "parallel.pp=2", "memory.optimizer_offload=all", "output.trace=true"}));
  t.step();
  t.step();
  for (int g = 0; g < t.world_size(); ++g) {
    SCOPED_TRACE("rank " + std::to_string(g));
    const std::vector<Span> h2d = spans_of(*t.trace(), g, "optimizer-h2d");
    const std::vector<Span> cpu = spans_of(*t.trace(), g, "optimizer-cpu");
    // Step 1's upload of each chunk: the first of its two (the stream runs them in order).
    std::vector<Span> uploads;
    for (const Span& s : h2d)
      if (s.cat == "optimizer" &&
          std::none_of(uploads.begin(), uploads.end(), [&](const Span& u) { return u.chunk == s.chunk; }))
        uploads.push_back(s);
    ASSERT_EQ(uploads.size(), 2u);
    ASSERT_GE(cpu.size(), 2u);  // step 1's updates first (the stream runs them in order)
    std::vector<double> upload_end(2);
    for (std::size_t c = 0; c < 2; ++c) {
      EXPECT_EQ(cpu[c].name, "update group " + std::to_string(c));
      auto up = std::find_if(uploads.begin(), uploads.end(), [&](const Span& s) { return s.chunk == int(c); });
      ASSERT_NE(up, uploads.end());
      EXPECT_GE(up->begin, cpu[c].end) << "chunk " << c << " uploaded before its update ended";
      upload_end[c] = up->end;
    }
    expect_waits_at_first_use(step2_spans(spans_of(*t.trace(), g, "compute")), upload_end);
  }
}

// The distributed optimizer (device state, dp 2) leaves its all-gathers in flight the same way:
// step 2 waits for chunk c's all-gather of step 1 ("AG dp chunk c ..." on dp-comm) right before
// its first op of chunk c, so the forward of one chunk overlaps the all-gather of the other.
TEST(OptimizerOffloadOrder, DistributedOptimizerAllGathersAreWaitedForAtEachChunksFirstUse) {
  stp::Trainer t(stp::testing::tiny_config({"parallel.schedule=zb-v", "parallel.pp=2", "parallel.dp=2",
                                            "parallel.distributed_optimizer=true", "output.trace=true"}));
  t.step();
  t.step();
  for (int g = 0; g < t.world_size(); ++g) {
    SCOPED_TRACE("rank " + std::to_string(g));
    // dp-comm runs in order: step 1's reduce-scatters, step 1's all-gathers, then step 2's.
    std::vector<double> gathered(2, -1.0);
    bool seen_gather = false;
    for (const Span& s : spans_of(*t.trace(), g, "dp-comm")) {
      const bool gather = s.name.rfind("AG dp chunk ", 0) == 0;
      if (!gather && seen_gather) break;  // step 2's first reduce-scatter
      if (!gather) continue;
      seen_gather = true;
      ASSERT_GE(s.chunk, 0);
      gathered[static_cast<std::size_t>(s.chunk)] = std::max(gathered[static_cast<std::size_t>(s.chunk)], s.end);
    }
    ASSERT_GE(gathered[0], 0.0);
    ASSERT_GE(gathered[1], 0.0);
    expect_waits_at_first_use(step2_spans(spans_of(*t.trace(), g, "compute")), gathered);
  }
}

// memory.optimizer_overlap (optim/host_update.h, Speculation): the CPU update of a chunk whose
// gradients are final early runs during the backward. 1f1b-i at pp 2, tp 2 over a slow emulated TP
// link: on pp rank 0 the later chunk (stage 2; stage 0 holds the tied embedding and does not
// speculate) finishes its backward a few B ops before the step ends, and each of those ops waits
// for all-reduces of milliseconds, far longer than that chunk's CPU update (tens of thousands of
// parameters; measured: ~0.1 ms against ~28 ms left). Clipping inactive, so every speculation
// commits. On some rank, a speculative update ends before step 1's last op on compute ends (the
// one timing margin, the link's), and each is followed by its commit. (zb-v is no case for it:
// its deferred Ws of both chunks end the step.)
TEST(OptimizerOffloadOrder, OverlapUpdatesAnEarlyChunkBeforeTheBackwardEnds) {
  stp::Trainer t(stp::testing::tiny_config(
      {"parallel.schedule=1f1b-i", "parallel.pp=2", "parallel.tp=2", "parallel.tp_link_bandwidth=2MB/s",
       "memory.optimizer_offload=all", "memory.optimizer_overlap=all", "train.grad_clip=1e9", "output.trace=true"}));
  const stp::StepResult r = t.step();
  t.full_parameters();  // settles the step's CPU updates: the commits still in flight reach the trace
  EXPECT_GT(r.speculation.committed, 0u);
  EXPECT_EQ(r.speculation.discarded, 0u);
  bool before_the_end = false;
  for (int g = 0; g < t.world_size(); ++g) {
    SCOPED_TRACE("rank " + std::to_string(g));
    const std::vector<Span> compute = spans_of(*t.trace(), g, "compute");
    const Span& step1 = named(compute, "step 1");
    double last_op_end = 0;
    for (const Span& s : compute)
      if (s.cat == "op" && s.begin >= step1.begin && s.end <= step1.end) last_op_end = std::max(last_op_end, s.end);
    const std::vector<Span> cpu = spans_of(*t.trace(), g, "optimizer-cpu");
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i].name.rfind("speculative update group ", 0) != 0) continue;
      const std::string commit = "commit group " + std::to_string(cpu[i].chunk);
      EXPECT_TRUE(std::any_of(cpu.begin() + static_cast<std::ptrdiff_t>(i), cpu.end(),
                              [&](const Span& s) { return s.name == commit; }))
          << cpu[i].name << " was not committed";
      before_the_end = before_the_end || cpu[i].end < last_op_end;
    }
  }
  EXPECT_TRUE(before_the_end) << "no speculative update ended before the backward did";
}

}  // namespace
