// GEMM algorithms chosen at setup (Trainer::prepared_gemms; core/gemm_shape.h): the shapes a
// trainer prepares before step 1 — from one step of the job on dry-run devices — are exactly the
// shapes step 1 runs on each device (every field, the operand alignments included), so no step
// chooses an algorithm itself (StepResult::late_gemm_choices is 0 on every device, step 1 and
// later). Swept over both architectures, two schedules, f32 and bf16, with and without the
// chunked loss head and tiled unit backward, at tp 2 x pp 2.
#include <gtest/gtest.h>

#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/gemm_shape.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;

struct GemmCase {
  std::string arch, schedule, precision;
  bool chunked = false;  // model.loss_chunk_tokens 8 and memory.unit_tiles 2 under full recompute
};

void PrintTo(const GemmCase& c, std::ostream* os) {
  *os << c.arch << " " << c.schedule << " " << c.precision << (c.chunked ? " chunked" : "");
}

std::string case_name(const ::testing::TestParamInfo<GemmCase>& p) {
  std::string s = p.param.arch + "_" + p.param.schedule + "_" + p.param.precision + (p.param.chunked ? "_chunked" : "");
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

std::vector<std::string> overrides(const GemmCase& c) {
  std::vector<std::string> o = {"parallel.tp=2", "parallel.pp=2", "parallel.schedule=" + c.schedule,
                                "train.precision=" + c.precision};
  if (c.arch == "llama") o.insert(o.end(), stp::testing::kLlama.begin(), stp::testing::kLlama.end());
  if (c.chunked) {
    o.push_back("model.loss_chunk_tokens=8");
    o.push_back("memory.recompute=full");
    o.push_back("memory.unit_tiles=2");
  } else {
    o.push_back("model.loss_chunk_tokens=none");
  }
  return o;
}

// The shapes of `a` not in `b`, one per line.
std::string missing(const std::set<stp::GemmShape>& a, const std::set<stp::GemmShape>& b) {
  std::ostringstream out;
  for (const stp::GemmShape& s : a)
    if (!b.count(s)) out << "  " << stp::to_string(s) << "\n";
  return out.str();
}

class GemmSetup : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmSetup, PreparedShapesAreExactlyTheShapesStepOneRuns) {
  stp::Trainer t(tiny_config(overrides(GetParam())));
  const std::vector<std::vector<stp::GemmShape>> prepared = t.prepared_gemms();
  ASSERT_EQ(prepared.size(), 4u);  // tp 2 x pp 2 devices in this process
  std::vector<stp::GemmLog> logs(prepared.size());
  std::vector<stp::GemmLog*> to(prepared.size());
  for (std::size_t i = 0; i < logs.size(); ++i) to[i] = &logs[i];
  t.set_gemm_logs(to);
  const stp::StepResult first = t.step();
  t.set_gemm_logs(std::vector<stp::GemmLog*>(prepared.size(), nullptr));
  for (std::size_t i = 0; i < prepared.size(); ++i) {
    const std::set<stp::GemmShape> ran = logs[i].distinct();
    const std::set<stp::GemmShape> set(prepared[i].begin(), prepared[i].end());
    EXPECT_EQ(set.size(), prepared[i].size()) << "device " << i << ": the prepared shapes repeat";
    EXPECT_GT(ran.size(), 0u) << "device " << i;
    EXPECT_EQ(set, ran) << "device " << i << ": run but not prepared:\n"
                        << missing(ran, set) << "prepared but not run:\n"
                        << missing(set, ran);
  }
  EXPECT_EQ(first.late_gemm_choices, std::vector<std::uint64_t>(prepared.size(), 0));
  EXPECT_EQ(t.step().late_gemm_choices, std::vector<std::uint64_t>(prepared.size(), 0));
}

std::vector<GemmCase> cases() {
  std::vector<GemmCase> out;
  for (const char* arch : {"gpt2", "llama"})
    for (const char* schedule : {"stp", "zb-v"})
      for (const char* precision : {"f32", "bf16"})
        for (bool chunked : {false, true}) out.push_back({arch, schedule, precision, chunked});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GemmSetup, ::testing::ValuesIn(cases()), case_name);

// The pipeline ranks of one layout run different GEMMs (the first has no head, the last no
// embedding): each device prepares its own, not a union.
TEST(GemmSetupRanks, EachPipelineRankPreparesItsOwnShapes) {
  stp::Trainer t(tiny_config({"parallel.pp=2", "model.loss_chunk_tokens=none"}));
  const auto prepared = t.prepared_gemms();
  ASSERT_EQ(prepared.size(), 2u);
  EXPECT_NE(prepared[0], prepared[1]);
}

}  // namespace
