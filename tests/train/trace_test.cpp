// What each rank actually executed, read back from the trace (output.trace: true):
//   * the op order of every rank equals the generated schedule;
//   * in braided blocks every all-reduce that has a following unit of the other part overlaps
//     compute of that other part, and no unit of the same part starts before its all-reduce ends.
// The TP link is emulated at a rate that makes each all-reduce take ~20 ms, far longer than a unit
// of this tiny model and than the OS scheduling jitter of a loaded 2-core machine, so overlap is a
// property of the executor's ordering, not of thread timing. That premise does not hold in the
// sanitizer builds: instrumented code runs many times slower, beside other instrumented tests on the
// same 2 cores, and an all-reduce queued behind a late one on the comm stream, or a unit waiting on
// a slowed neighbour stage, can miss its overlap. There the ordering checks stay and the overlap
// checks (a statement about timing) are left to the release build.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/trace.h"
#include "schedule/schedule.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kTimingHoldsItsPremise = false;
#else
constexpr bool kTimingHoldsItsPremise = true;
#endif

struct Span {
  std::string name, cat, part;
  double begin, end;
};

// Spans of one rank and stream, in time order.
std::vector<Span> spans_of(const stp::TraceRecorder& rec, int pid, const std::string& tid) {
  std::vector<Span> out;
  for (const auto& s : rec.spans()) {
    if (s.pid != pid || s.tid != tid) continue;
    std::string part;
    if (!s.args.empty()) {
      auto args = nlohmann::json::parse(s.args.json());
      if (args.contains("part")) part = args.at("part").get<std::string>();
    }
    out.push_back({s.name, s.category, part, s.ts_us, s.ts_us + s.dur_us});
  }
  std::sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  return out;
}

std::unique_ptr<stp::Trainer> traced_step(const std::string& schedule, double tp_link, bool vocab_parallel = true) {
  auto t = std::make_unique<stp::Trainer>(
      stp::testing::tiny_config({"parallel.schedule=" + schedule, "parallel.tp=2", "parallel.pp=2", "output.trace=true",
                                 "parallel.tp_link_bandwidth=" + std::to_string(tp_link),
                                 std::string("parallel.vocab_parallel=") + (vocab_parallel ? "true" : "false")}));
  t->step();
  return t;
}

// The all-reduces on tp-comm whose unit (the last word of "AR <part> <unit>") passes `unit`, and
// how many of those that have a following unit of the other part in a braided op overlap it.
struct BraidCount {
  int all_reduces = 0, braided = 0, overlapped = 0;
  std::string misses;
};

template <typename UnitFilter>
BraidCount count_braids(const stp::Trainer& t, UnitFilter unit) {
  BraidCount n;
  for (int g = 0; g < t.world_size(); ++g) {
    auto compute = spans_of(*t.trace(), g, "compute");
    auto comm = spans_of(*t.trace(), g, "tp-comm");
    std::vector<Span> ops, units;
    for (const Span& s : compute) (s.cat == "op" ? ops : units).push_back(s);
    for (const Span& ar : comm) {
      if (!unit(ar.name.substr(ar.name.rfind(' ') + 1))) continue;
      ++n.all_reduces;
      // Same part: its next F/B unit starts only after the all-reduce ended. (A fused W of the
      // producing unit runs under the all-reduce by design: it does not read the reduced tensor.)
      for (const Span& u : units) {
        if (u.part != ar.part || u.cat == "W" || u.begin < ar.begin) continue;
        EXPECT_GE(u.begin, ar.end) << "rank " << g << ": " << u.name << " started before " << ar.name << " ended";
        break;
      }
      // In a braided op, the all-reduce is in flight from the end of its producing unit (when the
      // comm stream may start it; on the CPU backend the comm thread's wake-up adds jitter to the
      // span's own start) to its end, and overlaps the next unit of the other part.
      auto producer = std::find_if(units.rbegin(), units.rend(),
                                   [&](const Span& u) { return u.part == ar.part && u.end <= ar.begin; });
      EXPECT_NE(producer, units.rend()) << ar.name;
      if (producer == units.rend()) continue;
      auto op = std::find_if(ops.begin(), ops.end(),
                             [&](const Span& o) { return o.begin <= producer->begin && producer->end <= o.end; });
      if (op == ops.end() || op->name.find_first_of("&+") == std::string::npos) continue;
      auto next_other = std::find_if(units.begin(), units.end(), [&](const Span& u) {
        return u.part != ar.part && u.begin >= producer->end && u.end <= op->end;
      });
      if (next_other == units.end()) continue;  // the block's tail: nothing left to hide under
      ++n.braided;
      bool overlaps = next_other->begin < ar.end && producer->end < next_other->end;
      n.overlapped += overlaps;
      if (!overlaps && n.misses.size() < 8)
        n.misses += stp::str("rank ", g, ": ", ar.name, " [", ar.begin, ", ", ar.end, ") does not overlap ",
                             next_other->name, "\n");
    }
  }
  return n;
}

// Whether one given all-reduce overlaps is up to the OS: on a shared 2-core machine (ctest -j2)
// the compute thread can be descheduled for longer than one all-reduce (~20 ms), and then the
// next unit starts after it ended (seen: 2 of 342, on the two ranks of one stage at the same
// instant). An executor that waits for each all-reduce before the other part's unit overlaps
// none, so nine in ten proves the braid and leaves room for such preemptions.
void expect_nine_in_ten_overlap(const BraidCount& n) {
  if (kTimingHoldsItsPremise) {
    EXPECT_GE(n.overlapped * 10, n.braided * 9) << n.overlapped << " of " << n.braided << " overlap; first misses:\n"
                                                << n.misses;
  }
}

TEST(ExecutorTrace, EveryRankRunsExactlyItsScheduleInOrder) {
  for (const char* name : {"stp", "zb-v", "1f1b-i", "gpipe"}) {
    auto t = traced_step(name, 0);
    auto sched = stp::sched::generate(name, 2, 8);
    for (int g = 0; g < t->world_size(); ++g) {
      std::vector<std::string> ran, want;
      for (const Span& s : spans_of(*t->trace(), g, "compute"))
        if (s.cat == "op") ran.push_back(s.name);
      for (const auto& op : sched.ranks[static_cast<std::size_t>(g / 2)]) want.push_back(stp::sched::to_string(op));
      EXPECT_EQ(ran, want) << name << " rank " << g;
    }
  }
}

TEST(ExecutorTrace, BraidedAllReducesHideUnderTheOtherPassAndPrecedeTheirConsumers) {
  // 4 KiB per all-reduce at 200 KB/s: ~20 ms each.
  auto t = traced_step("stp", 2e5);
  for (int g = 0; g < t->world_size(); ++g) ASSERT_FALSE(spans_of(*t->trace(), g, "tp-comm").empty());
  const BraidCount n = count_braids(*t, [](const std::string&) { return true; });
  EXPECT_GT(n.braided, 50);
  expect_nine_in_ten_overlap(n);
}

// Vocab-parallel, the embedding's output and the head's dln are partials summed on tp-comm by the
// executor, braided like a branch's (one of each per microbatch on each TP rank of the stage that
// holds them: 8 microbatches x 2 TP ranks); with the replicated vocabulary there are none.
TEST(ExecutorTrace, VocabParallelEmbedAndHeadAllReducesAreBraided) {
  auto vocab = traced_step("stp", 2e5);
  auto replicated = traced_step("stp", 0, false);
  for (const char* unit : {"embed", "head"}) {
    auto is_unit = [&](const std::string& u) { return u == unit; };
    const BraidCount n = count_braids(*vocab, is_unit);
    EXPECT_EQ(n.all_reduces, 16) << unit;
    EXPECT_GE(n.braided, 8) << unit;
    expect_nine_in_ten_overlap(n);
    EXPECT_EQ(count_braids(*replicated, is_unit).all_reduces, 0) << unit;
  }
}

}  // namespace
