// The dry-run backend: CpuDevice with CpuDeviceOptions::dry_run. Allocations are counted exactly
// but have no memory behind them (unique, never-dereferenced addresses); streams drop every task
// (kernels, copies, GEMMs, host tasks) and complete event records at once; communicators do
// nothing. A rank's host program — the executor walking its op list, the stage allocating its
// records, the offload engine — therefore runs at full speed with the same allocation sequence
// as a real run, which is how the memory planner predicts peaks exactly (memory/planner.h).
// Like PyTorch's meta device, the values computed are meaningless.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/device.h"

namespace stp {

class DryStream final : public Stream {
 public:
  DryStream(Device& device, std::string name) : device_(device), name_(std::move(name)) {}
  Device& device() override { return device_; }
  const std::string& name() const override { return name_; }
  void enqueue_host(std::function<void()>) override {}
  void copy(void*, const void*, std::size_t) override {}
  void retain_until_done(std::shared_ptr<const void>) override {}
  void zero(void*, std::size_t) override {}
  void gemm(const GemmArgs& g) override { note_gemm(g); }  // recorded only (Stream::set_gemm_log)
  void record(Event& event) override;                      // completes at once
  void wait(Event&) override {}
  void synchronize() override {}
  void trace_begin(std::string, std::string, TraceArgs) override {}
  void trace_end() override {}
  void set_trace(TraceRecorder*, int, std::string) override {}

 private:
  Device& device_;
  std::string name_;
};

bool is_dry(Stream& stream);
bool is_dry(const Device& device);  // a CpuDevice with CpuDeviceOptions::dry_run

// `size` communicators whose collectives and messages do nothing (for dry-run devices).
std::vector<std::unique_ptr<Communicator>> make_null_comms(int size);

}  // namespace stp
