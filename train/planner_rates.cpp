#include "train/planner_rates.h"

#include <algorithm>
#include <array>

#include "base/error.h"
#include "config/config.h"
#include "core/backend.h"

namespace stp {
namespace {

constexpr double kCpuLinkBytesPerS = 8e9;     // memcpy between host buffers
constexpr double kCpuFlopsPerThread = 100e9;  // FP32 GEMM of one AVX-512 core (120 measured on the dev host)

// Dense peaks from NVIDIA's data sheets. Links: PCIe 5.0 x16 is 63 GB/s per direction on paper;
// 55 GB/s is what D2H offload copies reached on an H200 here (docs/measurements/gpu-runs.md);
// PCIe 4.0 x16 (31.5 on paper) at the 25 GB/s such copies reach; GH200's NVLink-C2C on paper.
constexpr std::array<GpuRates, 12> kTable = {{
    {"GH200", 989.4e12, 67.0e12, 450e9, "NVLink-C2C"},
    {"H200 NVL", 835.0e12, 60.0e12, 55e9, "PCIe 5.0 x16"},
    {"H200", 989.4e12, 67.0e12, 55e9, "PCIe 5.0 x16"},  // SXM
    {"H100 NVL", 835.0e12, 60.0e12, 55e9, "PCIe 5.0 x16"},
    {"H100 PCIe", 756.0e12, 51.2e12, 55e9, "PCIe 5.0 x16"},
    {"H100", 989.4e12, 67.0e12, 55e9, "PCIe 5.0 x16"},  // SXM5 ("NVIDIA H100 80GB HBM3")
    {"A100", 312.0e12, 19.5e12, 25e9, "PCIe 4.0 x16"},
    {"L40S", 362.1e12, 91.6e12, 25e9, "PCIe 4.0 x16"},
    {"L40", 181.0e12, 90.5e12, 25e9, "PCIe 4.0 x16"},
    {"L4", 121.0e12, 30.3e12, 25e9, "PCIe 4.0 x16"},
    {"RTX 4090", 165.2e12, 82.6e12, 25e9, "PCIe 4.0 x16"},  // bf16 with f32 accumulation
    {"A10", 125.0e12, 31.2e12, 25e9, "PCIe 4.0 x16"},
}};
constexpr GpuRates kFallback = {"", 20e12, 20e12, 25e9, "PCIe 4.0 x16"};

}  // namespace

std::span<const GpuRates> gpu_rate_table() { return kTable; }

const GpuRates& gpu_rates(std::string_view gpu_name) {
  if (!gpu_name.empty())
    for (const GpuRates& r : kTable)
      if (gpu_name.find(r.match) != std::string_view::npos) return r;
  return kFallback;
}

PlannerRates planner_rates(const Config& c, std::string_view gpu_name) {
  PlannerRates out;
  if (c.parallel.backend == "cuda") {
    const GpuRates& row = gpu_rates(gpu_name);
    const bool bf16 = c.train.precision == "bf16";
    out.flops_per_s = bf16 ? row.bf16_flops : row.f32_flops;
    out.link_bytes_per_s = row.link_bytes_per_s;
    out.source = row.match.empty() ? str("CUDA fallback row (",
                                         gpu_name.empty() ? "no GPU to ask" : str("unknown GPU '", gpu_name, "'"), ")")
                                   : str("CUDA table row '", row.match, "' (", gpu_name, ")");
    out.source += bf16 ? ", bf16" : ", f32";
  } else {
    const double threads = std::max(1, c.parallel.cpu_threads);
    out.flops_per_s = kCpuFlopsPerThread * threads / (c.parallel.tp * c.parallel.pp);
    out.link_bytes_per_s = kCpuLinkBytesPerS;
    out.source = "CPU backend nominal";
  }
  if (c.memory.link_bandwidth > 0) {
    out.link_bytes_per_s = c.memory.link_bandwidth;
    out.source += "; link from memory.link_bandwidth";
  }
  return out;
}

PlannerRates planner_rates(const Config& c) {
  return planner_rates(c, c.parallel.backend == "cuda" ? cuda_gpu_name() : std::string());
}

}  // namespace stp
