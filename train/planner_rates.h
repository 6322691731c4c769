// The rates of the planner's cost model (docs/memory.md, Memory planner: the cost model): how
// fast a rank's GEMMs run and how fast activations and optimizer state cross the host link. The
// planner turns FLOP counts and bytes into seconds with them, to weigh recomputation against
// offload and to place reloads; they never change what a plan's memory is, only which plan wins.
//
// Nominal, never probed: `stp plan` and `stp train` of one config on one machine choose the same
// plan, run to run.
//   * CPU backend: 100 GFLOP/s per thread times the rank's share of parallel.cpu_threads; the
//     link 8 GB/s (memcpy between host buffers).
//   * CUDA backend: a row of the table below, chosen by the first GPU's name as the CUDA runtime
//     reports it (cudaGetDeviceProperties), at train.precision (bf16: tensor-core dense rate; f32:
//     the CUDA-core FP32 rate, since stp's f32 GEMMs run without TF32); the link is the row's host
//     link, one direction. Without a GPU to ask (a machine without one, a build without CUDA) or
//     for a name the table lacks, the fallback row.
//   * memory.link_bandwidth > 0 replaces the link rate on either backend.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace stp {

struct Config;

// One row of the CUDA table: datasheet dense peaks (no sparsity) and the host link.
struct GpuRates {
  std::string_view match;   // a substring of the GPU's name; rows are tried in order
  double bf16_flops;        // tensor cores, bf16 inputs, f32 accumulation
  double f32_flops;         // CUDA cores, no TF32
  double link_bytes_per_s;  // host <-> GPU, one direction
  std::string_view link;    // what the link is, for people
};

// The rows, most specific names first (docs/memory.md prints the same table).
std::span<const GpuRates> gpu_rate_table();
// The row for a GPU name ("NVIDIA H100 80GB HBM3"): the first whose `match` it contains, else the
// fallback row (match "", the rates the planner assumed before the table: 20 TFLOP/s, 25 GB/s).
const GpuRates& gpu_rates(std::string_view gpu_name);

struct PlannerRates {
  double flops_per_s = 0;       // one rank's GEMM rate
  double link_bytes_per_s = 0;  // offload copies, one direction
  // Where they come from, e.g. "CUDA table row 'H100' (NVIDIA H100 80GB HBM3), bf16" or
  // "CPU backend nominal"; "; link from memory.link_bandwidth" when that replaced the link.
  std::string source;
};

// The rates for `config`; gpu_name is the first GPU's name ("" when there is none to ask).
PlannerRates planner_rates(const Config& config, std::string_view gpu_name);
// The same with the GPU of this machine asked for its name when parallel.backend is cuda.
PlannerRates planner_rates(const Config& config);

}  // namespace stp
