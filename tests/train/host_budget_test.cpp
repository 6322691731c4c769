// Host memory as part of the budget (train/host_needs.h, train/memory_planning.h): the pageable
// estimate, this process's pinned part, and the errors before step 1, each against a fake machine
// (train/memory_settings.h, MachineMemory) so that no result depends on the machine the test runs on:
//   * an explicit memory.host_budget larger than what the machine has;
//   * pinned + pageable (+ the CPU backend's devices) larger than what the machine has;
//   * a host budget (auto included) that cannot hold the pinned model states.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/train/train_fixture.h"
#include "train/host_needs.h"
#include "train/memory_planning.h"
#include "train/memory_settings.h"
#include "train/trainer.h"

namespace {

using stp::testing::tiny_config;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

stp::MachineMemory machine(std::uint64_t bytes) {
  stp::MachineMemory m;
  m.memory.mem_total = bytes;
  return m;
}

// The message of check(), which must throw stp::Error.
template <typename F>
std::string error_of(F check) {
  try {
    check();
  } catch (const stp::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' in: " << text;
}

// P = the distinct parameters' elements (GPT-2, tied head: wte, wpe, 12C^2 + 13C per layer, ln_f).
// Every phase is streamed tensor by tensor: the save holds its largest tensor (wte, [256, C]) with
// its one shard at tp 1, then with its HF copy: 2 x 4 x 256C bytes, at any tp (a shard is at most
// the tensor, and the HF copy is all of it). model.init_from and train.resume hold the same the
// other way round (wte with its HF tensor, then with each rank's shard in turn), whatever dp; the
// peak is the largest phase.
TEST(HostNeeds, PageableIsTheLargestPhaseOfTheFullState) {
  stp::Config c = tiny_config({});
  const std::int64_t C = 32, L = 8;
  const std::int64_t P = 256 * C + 16 * C + L * (12 * C * C + 13 * C) + 2 * C;
  EXPECT_EQ(stp::full_parameter_count(c), P);
  const auto save = static_cast<std::size_t>(2 * 4 * 256 * C);
  stp::HostPageable b = stp::pageable_host_bytes(c);
  EXPECT_EQ(b.checkpoint_save, save);
  EXPECT_EQ(b.init_from, 0u);
  EXPECT_EQ(b.resume, 0u);
  EXPECT_EQ(b.peak(), save);
  c.model.init_from = "model.safetensors";
  EXPECT_EQ(stp::pageable_host_bytes(c).init_from, save);
  EXPECT_EQ(stp::pageable_host_bytes(c).peak(), save);
  c.train.resume = "runs/x/checkpoint-3";
  EXPECT_EQ(stp::pageable_host_bytes(c).resume, save);
  c.parallel.dp = 2;
  EXPECT_EQ(stp::pageable_host_bytes(c).peak(), save);
  // The same parameters however they are split; the same save and load at tp 2 (vocab-parallel
  // wte: a shard of half the rows, and the HF copy whole).
  stp::Config split = tiny_config({"parallel.tp=2", "parallel.pp=2", "parallel.schedule=zb-v"});
  EXPECT_EQ(stp::full_parameter_count(split), P);
  EXPECT_EQ(stp::pageable_host_bytes(split).checkpoint_save, save);
  split.train.resume = "runs/x/checkpoint-3";
  EXPECT_EQ(stp::pageable_host_bytes(split).resume, save);
}

// Pinned: the plan's pools and host model states, every replica in one process; devices: the CPU
// backend's peaks.
TEST(HostNeeds, PinnedAndDevicesAreThePlansForEveryReplica) {
  const stp::Config one = tiny_config({"memory.optimizer_offload=all"});
  const stp::MemoryPlan plan = stp::make_memory_plan(one);
  std::size_t states = 0, device = 0;
  for (const stp::RankPrediction& p : plan.predicted) states += p.host_states.total(), device += p.peak_device_bytes;
  ASSERT_GT(states, 0u);
  const stp::HostNeeds n = stp::host_needs(plan, one);
  EXPECT_EQ(n.pinned_states, states);
  EXPECT_EQ(n.devices, device);
  EXPECT_EQ(n.total(), n.pinned() + n.pageable.peak() + n.devices);
  stp::Config two = one;
  two.parallel.dp = 2;
  const stp::HostNeeds n2 = stp::host_needs(plan, two);
  EXPECT_EQ(n2.pinned(), 2 * n.pinned());
  EXPECT_EQ(n2.devices, 2 * n.devices);
  two.parallel.backend = "cuda";  // a GPU's memory is not the host's
  EXPECT_EQ(stp::host_needs(plan, two).devices, 0u);
}

TEST(HostBudget, ABudgetLargerThanTheMachineIsAnErrorNamingBoth) {
  const stp::Config c = tiny_config({"memory.host_budget=4GiB"});
  const stp::MemoryPlan plan = stp::make_memory_plan(c);
  expect_contains(error_of([&] { stp::check_host_machine(plan, c, stp::memory_settings(c, machine(2 * GiB))); }),
                  {"memory.host_budget = 4.00 GiB but this machine has 2.00 GiB (MemTotal)",
                   "lower memory.host_budget to at most that, or set it to auto (1.00 GiB here"});
  EXPECT_NO_THROW(stp::check_host_machine(plan, c, stp::memory_settings(c, machine(4 * GiB))));
  // auto and null never ask for more than the machine has.
  for (const char* b : {"memory.host_budget=auto", "memory.host_budget=null"}) {
    const stp::Config d = tiny_config({b});
    EXPECT_NO_THROW(stp::check_host_machine(plan, d, stp::memory_settings(d, machine(2 * GiB)))) << b;
  }
}

// The whole run's host memory, exactly at and one byte above the machine.
TEST(HostBudget, PinnedAndPageableAboveTheMachineIsAnError) {
  const stp::Config c = tiny_config({"memory.optimizer_offload=all", "memory.host_budget=null"});
  const stp::MemoryPlan plan = stp::make_memory_plan(c);
  const stp::HostNeeds n = stp::host_needs(plan, c);
  EXPECT_NO_THROW(stp::check_host_machine(plan, c, stp::memory_settings(c, machine(n.total()))));
  const std::string what =
      error_of([&] { stp::check_host_machine(plan, c, stp::memory_settings(c, machine(n.total() - 1))); });
  expect_contains(what, {"the run needs " + stp::format_bytes(n.total(), stp::ByteStyle::Human, stp::Rounding::Up),
                         stp::format_bytes(n.pinned()) + " pinned", stp::format_bytes(n.pageable.peak()) + " pageable",
                         stp::format_bytes(n.devices) + " of the CPU backend's devices",
                         "but this machine has " + stp::format_bytes(n.total() - 1) + " (MemTotal)",
                         "memory.optimizer_offload: none"});
}

// auto on a small machine: the budget is half of it (the reserve's cap); one byte short of the
// pinned states is an error naming the states, the budget as auto resolved it and the knob.
TEST(HostBudget, AnAutoBudgetTooSmallForThePinnedStatesNamesBothNumbers) {
  const stp::Config c = tiny_config({"memory.optimizer_offload=all"});
  const stp::MemoryPlan plan = stp::make_memory_plan(c);
  const std::size_t pinned = stp::host_needs(plan, c).pinned();
  const stp::MemorySettings short_by_one = stp::memory_settings(c, machine(2 * pinned - 2));
  ASSERT_EQ(short_by_one.host_budget, pinned - 1);
  expect_contains(
      error_of([&] { stp::check_plan(plan, c, short_by_one); }),
      {"memory.host_budget = auto = " + stp::format_bytes(pinned - 1),
       "is too small for the model states in pinned host memory: the plan needs " + stp::format_bytes(pinned),
       "raise memory.host_budget to at least that, or set memory.optimizer_offload: none"});
  EXPECT_NO_THROW(stp::check_plan(plan, c, stp::memory_settings(c, machine(2 * pinned))));
}

// The trainer holds the run against the machine it runs on before step 1: no machine has 1000 TiB.
TEST(HostBudget, TheTrainerRefusesABudgetAboveThisMachine) {
  const std::string what = error_of([] { stp::Trainer t(tiny_config({"memory.host_budget=1000TiB"})); });
  expect_contains(what, {"memory.host_budget = 1000 TiB but this machine has", "set it to auto"});
}

}  // namespace
