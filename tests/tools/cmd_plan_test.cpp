// `stp plan` end to end: the text output prints every size once (a human size, or the exact bytes
// with --bytes), one table row per device, and its numbers are --json's. Skipped when the stp
// executable has not been built (it links every library of the project).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/config.h"
#include "tests/support/run_command.h"
#include "train/host_needs.h"
#include "train/memory_settings.h"

namespace {

using Result = stp::testing::CommandResult;
using stp::testing::have_stp;

Result run_plan(const std::string& args) {
  return stp::testing::run_stp("plan " + std::string(STP_SOURCE_DIR) + "/configs/tiny.yaml " + args);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Every size in `text`, in order, as printed: "971 KiB", "22398208 B".
std::vector<std::string> sizes_in(const std::string& text) {
  static const std::regex size(R"(\b\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)\b)");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), size); it != std::sregex_iterator(); ++it)
    out.push_back(it->str());
  return out;
}

// The rows of the table under the line `title` (header excluded), up to the first line that is not
// a row: a blank line or a note in parentheses.
std::vector<std::string> table_rows(const std::string& text, const std::string& title) {
  std::vector<std::string> lines = lines_of(text), rows;
  std::size_t at = 0;
  while (at < lines.size() && lines[at] != title) ++at;
  EXPECT_LT(at + 1, lines.size()) << "no table '" << title << "' in:\n" << text;
  for (at += 2; at < lines.size() && !lines[at].empty() && lines[at][0] != '('; ++at) rows.push_back(lines[at]);
  return rows;
}

std::string exact(std::size_t b) { return stp::format_bytes(b, stp::ByteStyle::Exact); }

// The device table's size cells of device g as `style` prints them: peak, weights, gradients,
// optimizer state, activations, buffers, embedding + LM head.
std::vector<std::string> device_cells(const nlohmann::json& rank, stp::ByteStyle style) {
  const nlohmann::json& cat = rank["peak_by_category"];
  std::vector<std::string> out;
  for (std::size_t b : {rank["peak_device_bytes"].get<std::size_t>(), cat["weights"].get<std::size_t>(),
                        cat["gradients"].get<std::size_t>(), cat["optimizer_state"].get<std::size_t>(),
                        cat["activations"].get<std::size_t>(), cat["buffers"].get<std::size_t>(),
                        rank["vocab_param_bytes"].get<std::size_t>()})
    out.push_back(stp::format_bytes(b, style));
  return out;
}

// Parameter streaming's bytes per step of one device, both directions.
std::size_t streamed_bytes(const nlohmann::json& rank) {
  const nlohmann::json& s = rank["param_stream_bytes_per_step"];
  return s["weights_up"].get<std::size_t>() + s["grads_up"].get<std::size_t>() + s["grads_down"].get<std::size_t>();
}

// Whether some device streams (then the pinned host table has a column more).
bool streams(const nlohmann::json& plan) {
  for (const nlohmann::json& rank : plan["ranks"])
    if (streamed_bytes(rank) > 0) return true;
  return false;
}

// The pinned host table's cells: activations, weights, gradients, optimizer state (host model
// states), offloaded bytes per step, and with `streaming` the streamed bytes per step.
std::vector<std::string> host_cells(const nlohmann::json& rank, stp::ByteStyle style, bool streaming = false) {
  const nlohmann::json& host = rank["model_states_host"];
  std::vector<std::string> out;
  for (std::size_t b : {rank["host_pinned_bytes"].get<std::size_t>(), host["weights"].get<std::size_t>(),
                        host["gradients"].get<std::size_t>(), host["optimizer_state"].get<std::size_t>(),
                        rank["offload_bytes_per_step"].get<std::size_t>()})
    out.push_back(stp::format_bytes(b, style));
  if (streaming) out.push_back(stp::format_bytes(streamed_bytes(rank), style));
  return out;
}

// Runs the plan three ways (text, --bytes, --json) with `set` and checks what every form must hold;
// returns the three outputs.
struct Forms {
  std::string human, bytes;
  nlohmann::json json;
};

Forms plan_forms(const std::string& set, int status) {
  Forms f;
  Result human = run_plan(set), bytes = run_plan(set + " --bytes"), json = run_plan(set + " --json");
  EXPECT_EQ(human.status, status) << human.err;
  EXPECT_EQ(bytes.status, status) << bytes.err;
  EXPECT_EQ(json.status, status) << json.err;
  f.human = human.out;
  f.bytes = bytes.out;
  f.json = nlohmann::json::parse(json.out);
  return f;
}

// Whether the plan puts anything in pinned host memory (then the text has the pinned host table).
bool uses_host(const nlohmann::json& plan) {
  for (const nlohmann::json& rank : plan["ranks"])
    for (const std::string& b : host_cells(rank, stp::ByteStyle::Exact))
      if (b != "0 B") return true;
  return false;
}

// The sizes of the host memory section: pinned, memory.host_budget (and the reserve under auto;
// none when unlimited), pageable, the CPU backend's devices, the total and what the machine has.
std::size_t host_section_sizes(const nlohmann::json& plan) {
  return 1 + (plan.contains("host_budget") ? 1 : 0) + (plan["host_budget_auto"].get<bool>() ? 1 : 0) + 1 +
         (plan["host_device_bytes"].get<std::size_t>() > 0 ? 1 : 0) + 1 + (plan.contains("host_available") ? 1 : 0);
}

// `extra`: the sizes of the error line of an infeasible plan.
void expect_one_size_per_number(const Forms& f, std::size_t extra = 0) {
  const std::size_t devices = f.json["ranks"].size();
  const bool host_table = uses_host(f.json), streaming = streams(f.json);
  // The device table: one row per device, in order, its sizes --json's numbers (every one exact
  // under --bytes, the same numbers formatted under the default).
  for (auto [text, style] : {std::pair{f.human, stp::ByteStyle::Human}, std::pair{f.bytes, stp::ByteStyle::Exact}}) {
    SCOPED_TRACE(text);
    std::vector<std::string> rows = table_rows(text, "device memory at the predicted peak");
    ASSERT_EQ(rows.size(), devices);
    for (std::size_t g = 0; g < devices; ++g) {
      EXPECT_EQ(rows[g].find_first_not_of(' '), rows[g].find(std::to_string(g))) << rows[g];
      EXPECT_EQ(sizes_in(rows[g]), device_cells(f.json["ranks"][g], style)) << "device " << g;
    }
    if (host_table) {
      std::vector<std::string> host = table_rows(text, "pinned host memory");
      ASSERT_EQ(host.size(), devices);
      for (std::size_t g = 0; g < devices; ++g) {
        EXPECT_EQ(sizes_in(host[g]), host_cells(f.json["ranks"][g], style, streaming)) << "device " << g;
      }
    }
  }
  // No number twice: the header's budget and minimum, 7 sizes per device row (5 per pinned host
  // row), the host memory section's, each once (and the error line's); the two forms print the
  // same numbers.
  const std::size_t expected =
      2 + 7 * devices + (host_table ? (streaming ? 6 : 5) * devices : 0) + host_section_sizes(f.json) + extra;
  EXPECT_EQ(sizes_in(f.human).size(), expected) << f.human;
  EXPECT_EQ(sizes_in(f.bytes).size(), expected) << f.bytes;
  EXPECT_EQ(f.human.find("B)"), std::string::npos) << f.human;
  EXPECT_EQ(f.human.find("bytes"), std::string::npos) << f.human;
  for (const std::string& s : sizes_in(f.human))  // a byte count only under 1 KiB
    EXPECT_FALSE(std::regex_match(s, std::regex(R"(\d{4,} B)"))) << s;
  for (const std::string& s : sizes_in(f.bytes)) EXPECT_TRUE(std::regex_match(s, std::regex(R"(\d+ B)"))) << s;
  // The header's minimum is rounded up (setting it fits), and exact under --bytes.
  const std::size_t minimum = f.json["min_device_budget"].get<std::size_t>();
  EXPECT_NE(
      f.human.find(", minimum feasible " + stp::format_bytes(minimum, stp::ByteStyle::Human, stp::Rounding::Up) + "\n"),
      std::string::npos)
      << f.human;
  EXPECT_NE(f.bytes.find(", minimum feasible " + exact(minimum) + "\n"), std::string::npos) << f.bytes;
}

}  // namespace

// The README's job: four devices (tp 2, pp 2), everything on the device.
TEST(CmdPlan, EachSizeOnceAndOneRowPerDevice) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Forms f = plan_forms("", 0);
  ASSERT_EQ(f.json["ranks"].size(), 4u);
  EXPECT_FALSE(uses_host(f.json));
  expect_one_size_per_number(f);
  EXPECT_NE(f.human.find("device budget 256 MiB, "), std::string::npos) << f.human;
  EXPECT_NE(f.bytes.find("device budget 268435456 B, "), std::string::npos) << f.bytes;
  EXPECT_NE(f.human.find("\npinned host memory: none"), std::string::npos) << f.human;
  // The time table: one row per device, its compute --json's compute_s in ms to one decimal.
  std::vector<std::string> time =
      table_rows(f.human, "predicted time per step in ms: the compute and what the levers add to it");
  ASSERT_EQ(time.size(), 4u);
  for (std::size_t g = 0; g < time.size(); ++g) {
    std::istringstream row(time[g]);
    std::size_t device = 99;
    double compute_ms = -1;
    row >> device >> compute_ms;
    EXPECT_EQ(device, g) << time[g];
    EXPECT_NEAR(compute_ms, 1e3 * f.json["ranks"][g]["compute_s"].get<double>(), 0.051) << time[g];
  }
  // Device 0 of the exact prediction the training tests measure: 22,398,464 B.
  EXPECT_EQ(f.json["ranks"][0]["peak_device_bytes"], 22398464u);
  EXPECT_NE(table_rows(f.bytes, "device memory at the predicted peak")[0].find(" 22398464 B "), std::string::npos);
}

// What benchmarks read besides the plan: the model FLOPs per token stp train's MFU uses, the
// tokens per step, and the cost model's rates with their source (train/planner_rates.h).
TEST(CmdPlan, JsonNamesTheModelFlopsAndTheCostModelsRates) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Result r = run_plan("--json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["model_flops_per_token"].get<double>(), 0);
  stp::Config c = stp::load_config(std::string(STP_SOURCE_DIR) + "/configs/tiny.yaml");
  EXPECT_EQ(j["tokens_per_step"].get<std::int64_t>(),
            std::int64_t{c.train.micro_batch_size} * c.train.microbatches * c.model.seq_len * c.parallel.dp);
  EXPECT_EQ(j["cost_model"]["source"], "CPU backend nominal");
  EXPECT_DOUBLE_EQ(j["cost_model"]["link_bytes_per_s"].get<double>(), 8e9);
  Result linked = run_plan("--json --set memory.link_bandwidth=3GB/s");
  ASSERT_EQ(linked.status, 0) << linked.err;
  nlohmann::json l = nlohmann::json::parse(linked.out);
  EXPECT_DOUBLE_EQ(l["cost_model"]["link_bytes_per_s"].get<double>(), 3e9);
  EXPECT_NE(l["cost_model"]["source"].get<std::string>().find("memory.link_bandwidth"), std::string::npos);
}

// Optimizer state in pinned host memory: the pinned host table, one row per device.
TEST(CmdPlan, PinnedHostTable) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Forms f = plan_forms("--set memory.optimizer_offload=all", 0);
  EXPECT_GT(f.json["ranks"][0]["model_states_host"]["optimizer_state"].get<std::size_t>(), 0u);
  EXPECT_EQ(f.human.find("pinned host memory: none"), std::string::npos) << f.human;
  expect_one_size_per_number(f);
}

// Parameter streaming: the pinned host table's column of bytes streamed per step, --json's
// param_stream_bytes_per_step, every size once; none of it without streaming.
TEST(CmdPlan, StreamedBytesPerStep) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Forms f = plan_forms("--set memory.optimizer_offload=all --set memory.param_offload=all", 0);
  ASSERT_TRUE(streams(f.json));
  for (const nlohmann::json& rank : f.json["ranks"]) EXPECT_GT(streamed_bytes(rank), 0u);
  EXPECT_NE(f.human.find("streamed per step"), std::string::npos) << f.human;
  expect_one_size_per_number(f);
  Forms none = plan_forms("--set memory.optimizer_offload=all --set memory.param_offload=none", 0);
  EXPECT_FALSE(streams(none.json));
  EXPECT_EQ(none.human.find("streamed per step"), std::string::npos) << none.human;
}

// An infeasible budget: exit 1, the plan printed, and one error line naming the budget, the
// minimum (rounded up, or exact under --bytes) and what to change, every size once.
TEST(CmdPlan, InfeasibleNamesTheMinimumOnce) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Forms f = plan_forms("--set memory.device_budget=1MiB", 1);
  EXPECT_FALSE(f.json["feasible"].get<bool>());
  const std::size_t minimum = f.json["min_device_budget"].get<std::size_t>();
  auto error_line = [](const std::string& text) {
    for (const std::string& line : lines_of(text))
      if (line.rfind("not feasible: ", 0) == 0) return line;
    return std::string();
  };
  const std::string human = error_line(f.human), bytes = error_line(f.bytes);
  EXPECT_EQ(human.rfind("not feasible: memory.device_budget = 1.00 MiB is too small", 0), 0u) << f.human;
  EXPECT_EQ(bytes.rfind("not feasible: memory.device_budget = 1048576 B is too small", 0), 0u) << f.bytes;
  const std::string rounded_up = stp::format_bytes(minimum, stp::ByteStyle::Human, stp::Rounding::Up);
  EXPECT_NE(human.find("The minimum feasible budget is " + rounded_up + "; raise memory.device_budget to at least"),
            std::string::npos)
      << human;
  EXPECT_NE(bytes.find("The minimum feasible budget is " + exact(minimum) + "; raise memory.device_budget"),
            std::string::npos)
      << bytes;
  // budget, the worst peak, its five categories, the minimum: eight sizes, the same in both forms.
  EXPECT_EQ(sizes_in(human).size(), 8u) << human;
  EXPECT_EQ(sizes_in(bytes).size(), 8u) << bytes;
  EXPECT_EQ(human.find("B)"), std::string::npos) << human;
  EXPECT_EQ(human.find("bytes"), std::string::npos) << human;
  EXPECT_EQ(human.find(std::to_string(minimum)), std::string::npos) << human;
  expect_one_size_per_number(f, /*extra=*/8);
}

// Host memory: pinned (the pools and host model states), pageable (the checkpoint save's largest
// tensor twice for this config) and the CPU backend's devices, against memory.host_budget and
// what this machine has (train/host_needs.h). A budget above the machine is a note, not a failed
// plan: a plan may be made for another machine.
TEST(CmdPlan, HostMemoryPinnedPageableAndTheMachine) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Forms f = plan_forms("--set memory.optimizer_offload=all", 0);
  const nlohmann::json& j = f.json;
  const stp::Config cfg = stp::load_config(std::string(STP_SOURCE_DIR) + "/configs/tiny.yaml");
  // The save holds one full f32 tensor with a shard of it or its HF copy: here the largest, an MLP
  // weight [C, 4C], with its HF copy (the same shape).
  const auto C = static_cast<std::size_t>(cfg.model.n_embd);
  const std::size_t pageable = 2 * 4 * C * 4 * C;
  EXPECT_EQ(j["host_pageable_bytes"].get<std::size_t>(), pageable);
  EXPECT_EQ(j["host_pageable"]["checkpoint_save"].get<std::size_t>(), pageable);
  std::size_t pinned = 0, devices = 0;
  for (const nlohmann::json& r : j["ranks"]) {
    const nlohmann::json& h = r["model_states_host"];
    pinned += r["host_pinned_bytes"].get<std::size_t>() + h["weights"].get<std::size_t>() +
              h["gradients"].get<std::size_t>() + h["optimizer_state"].get<std::size_t>();
    devices += r["peak_device_bytes"].get<std::size_t>();
  }
  EXPECT_GT(pinned, 0u);
  EXPECT_EQ(j["host_pinned_total"].get<std::size_t>(), pinned);
  EXPECT_EQ(j["host_device_bytes"].get<std::size_t>(), devices);
  EXPECT_EQ(j["host_total_bytes"].get<std::size_t>(), pinned + pageable + devices);
  EXPECT_EQ(j["host_budget"].get<std::size_t>(), std::size_t{4} << 30);
  EXPECT_FALSE(j["host_budget_auto"].get<bool>());
  ASSERT_TRUE(j.contains("host_available"));
  EXPECT_TRUE(j["host_fits_machine"].get<bool>());
  EXPECT_NE(f.bytes.find("\nhost memory of this process\npinned "), std::string::npos) << f.bytes;
  EXPECT_NE(f.bytes.find(exact(pinned) + "  of memory.host_budget 4294967296 B\n"), std::string::npos) << f.bytes;
  EXPECT_NE(f.bytes.find(exact(pageable) + "  at its peak, the checkpoint save"), std::string::npos) << f.bytes;
  EXPECT_NE(f.bytes.find(exact(devices) + "  the CPU backend's emulated devices"), std::string::npos) << f.bytes;
  EXPECT_NE(
      f.bytes.find(exact(pinned + pageable + devices) + "  of " + exact(j["host_available"].get<std::size_t>()) + " ("),
      std::string::npos)
      << f.bytes;
  // auto: this machine's share less the reserve.
  Forms a = plan_forms("--set memory.host_budget=auto", 0);
  EXPECT_TRUE(a.json["host_budget_auto"].get<bool>());
  const std::size_t has = a.json["host_available"].get<std::size_t>();
  EXPECT_EQ(a.json["host_budget"].get<std::size_t>(), has - stp::host_reserve_bytes(has));
  expect_one_size_per_number(a);
  // More than the machine has: exit 0, the plan and a note naming both numbers.
  Result big = run_plan("--set memory.host_budget=1000TiB");
  EXPECT_EQ(big.status, 0) << big.err;
  EXPECT_NE(big.out.find("\non this machine: memory.host_budget = 1000 TiB but this machine has "), std::string::npos)
      << big.out;
  Result big_json = run_plan("--json --set memory.host_budget=1000TiB");
  EXPECT_FALSE(nlohmann::json::parse(big_json.out)["host_fits_machine"].get<bool>());
}

// A host budget that cannot hold the offloaded optimizer state: the plan is printed (its dry runs
// measure the pinned bytes without the budget), then the error naming both numbers and the knob.
TEST(CmdPlan, AHostBudgetTooSmallForTheStatesIsNamedAfterThePlan) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Result r = run_plan("--set memory.optimizer_offload=all --set memory.host_budget=64KiB");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.out.find("\nhost memory of this process\n"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("\nnot feasible: memory.host_budget = 64.0 KiB is too small for the model states in pinned "
                       "host memory: the plan needs "),
            std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find("raise memory.host_budget to at least that"), std::string::npos) << r.out;
}

TEST(CmdPlan, JsonAndBytesAreExclusive) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Result r = run_plan("--json --bytes");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("stp plan: error: ", 0), 0u) << r.err;
}

namespace {

// A config `stp train` refuses before its first step, for a reason that needs no data, is not
// called feasible by `stp plan`: the plan refuses it with the same message.
TEST(CmdPlan, RefusesWhatTrainRefusesBeforeTheFirstStep) {
  if (!have_stp()) GTEST_SKIP() << "stp not built";
  Result r = run_plan("--set memory.copy_engine_cpus=100000");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.err.find("stp plan: error: memory.copy_engine_cpus = 100000 leaves no CPU for compute"),
            std::string::npos)
      << r.err;
}

}  // namespace
