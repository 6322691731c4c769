// The planner's cost-model rates (train/planner_rates.h): the CUDA table by GPU name and
// precision, the fallback row, the CPU backend's nominal rates and memory.link_bandwidth
// replacing the link on both backends.
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"
#include "tests/train/train_fixture.h"
#include "train/planner_rates.h"

namespace {

using stp::testing::tiny_config;

TEST(PlannerRates, GpuNamesPickTheirRows) {
  // nvidia-smi / cudaGetDeviceProperties names.
  EXPECT_EQ(stp::gpu_rates("NVIDIA H100 80GB HBM3").match, "H100");
  EXPECT_DOUBLE_EQ(stp::gpu_rates("NVIDIA H100 80GB HBM3").bf16_flops, 989.4e12);
  EXPECT_DOUBLE_EQ(stp::gpu_rates("NVIDIA H100 80GB HBM3").f32_flops, 67.0e12);
  EXPECT_DOUBLE_EQ(stp::gpu_rates("NVIDIA H100 80GB HBM3").link_bytes_per_s, 55e9);
  EXPECT_EQ(stp::gpu_rates("NVIDIA H100 PCIe").match, "H100 PCIe");
  EXPECT_EQ(stp::gpu_rates("NVIDIA H100 NVL").match, "H100 NVL");
  EXPECT_EQ(stp::gpu_rates("NVIDIA H200").match, "H200");
  EXPECT_EQ(stp::gpu_rates("NVIDIA GH200 480GB").match, "GH200");
  EXPECT_EQ(stp::gpu_rates("NVIDIA A100-SXM4-80GB").match, "A100");
  EXPECT_DOUBLE_EQ(stp::gpu_rates("NVIDIA A100-SXM4-80GB").bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(stp::gpu_rates("NVIDIA A100-SXM4-80GB").link_bytes_per_s, 25e9);
  EXPECT_EQ(stp::gpu_rates("NVIDIA L40S").match, "L40S");
  EXPECT_EQ(stp::gpu_rates("NVIDIA L4").match, "L4");
  EXPECT_EQ(stp::gpu_rates("NVIDIA GeForce RTX 4090").match, "RTX 4090");
  EXPECT_EQ(stp::gpu_rates("NVIDIA A10").match, "A10");
}

TEST(PlannerRates, UnknownOrNoGpuTakesTheFallbackRow) {
  for (const char* name : {"", "Tesla V100-SXM2-16GB", "Some Future GPU"}) {
    const stp::GpuRates& r = stp::gpu_rates(name);
    EXPECT_EQ(r.match, "") << name;
    EXPECT_DOUBLE_EQ(r.bf16_flops, 20e12) << name;
    EXPECT_DOUBLE_EQ(r.f32_flops, 20e12) << name;
    EXPECT_DOUBLE_EQ(r.link_bytes_per_s, 25e9) << name;
  }
}

TEST(PlannerRates, EveryRowIsReachableByItsOwnName) {
  // Rows are tried in order: a row shadowed by an earlier, shorter match would never be chosen.
  for (const stp::GpuRates& r : stp::gpu_rate_table()) {
    EXPECT_EQ(stp::gpu_rates(std::string("NVIDIA ") + std::string(r.match)).match, r.match);
    EXPECT_GT(r.bf16_flops, 0);
    EXPECT_GT(r.f32_flops, 0);
    EXPECT_GT(r.link_bytes_per_s, 0);
  }
}

TEST(PlannerRates, CudaUsesThePrecisionsRate) {
  stp::Config bf16 = tiny_config({"parallel.backend=cuda", "train.precision=bf16"});
  stp::Config f32 = tiny_config({"parallel.backend=cuda", "train.precision=f32"});
  stp::PlannerRates a = stp::planner_rates(bf16, "NVIDIA H200");
  stp::PlannerRates b = stp::planner_rates(f32, "NVIDIA H200");
  EXPECT_DOUBLE_EQ(a.flops_per_s, 989.4e12);
  EXPECT_DOUBLE_EQ(b.flops_per_s, 67.0e12);
  EXPECT_DOUBLE_EQ(a.link_bytes_per_s, 55e9);
  EXPECT_NE(a.source.find("'H200'"), std::string::npos) << a.source;
  EXPECT_NE(a.source.find("bf16"), std::string::npos) << a.source;
  stp::PlannerRates none = stp::planner_rates(f32, "");
  EXPECT_DOUBLE_EQ(none.flops_per_s, 20e12);
  EXPECT_NE(none.source.find("no GPU to ask"), std::string::npos) << none.source;
}

TEST(PlannerRates, LinkBandwidthReplacesTheLinkOnEveryBackend) {
  stp::Config cuda = tiny_config({"parallel.backend=cuda", "memory.link_bandwidth=12GB/s"});
  stp::PlannerRates c = stp::planner_rates(cuda, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(c.link_bytes_per_s, 12e9);
  EXPECT_DOUBLE_EQ(c.flops_per_s, cuda.train.precision == "bf16" ? 989.4e12 : 67.0e12);
  EXPECT_NE(c.source.find("memory.link_bandwidth"), std::string::npos) << c.source;
  stp::Config cpu = tiny_config({"memory.link_bandwidth=3GB/s", "parallel.cpu_threads=4", "parallel.pp=2"});
  stp::PlannerRates p = stp::planner_rates(cpu, "NVIDIA H100 80GB HBM3");  // the name is not asked for
  EXPECT_DOUBLE_EQ(p.link_bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(p.flops_per_s, 100e9 * 4 / 2);
  stp::PlannerRates nominal = stp::planner_rates(tiny_config({}), "");
  EXPECT_DOUBLE_EQ(nominal.link_bytes_per_s, 8e9);
}

}  // namespace
