// Internals of the CPU backend's streams and events, shared by CpuDevice, HostComm and the
// CPU kernel launcher. Not for use outside core/.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"

namespace stp {

class CpuDevice;

// Event state is shared with the stream tasks that record or wait on it, so an event may be
// destroyed while a record is still pending (as cudaEventDestroy allows).
struct CpuEventState {
  std::uint64_t mark_recorded();            // host side of Stream::record: a new generation
  std::uint64_t latest() const;             // most recent generation recorded (0 = never)
  void complete(std::uint64_t generation);  // stream side: this generation has been reached
  void wait_for(std::uint64_t generation);  // block until `generation` completed
  bool query() const;
  // Steady-clock time (ns) at which the most recent record completed; asserts it has completed.
  std::int64_t completed_at_ns() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t recorded_ = 0;
  std::uint64_t completed_ = 0;
  std::int64_t completed_at_ns_ = 0;  // when generation completed_ was reached
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(bool timing = false) : timing_(timing) {}
  bool query() override { return state_->query(); }
  void synchronize() override { state_->wait_for(state_->latest()); }
  // Same contract as CUDA (timing events only, both recorded and completed), so misuse that would
  // fail on a GPU fails here too.
  double elapsed_ms(Event& start) override;
  const std::shared_ptr<CpuEventState>& state() const { return state_; }

 private:
  bool timing_;
  std::shared_ptr<CpuEventState> state_ = std::make_shared<CpuEventState>();
};

class CpuStream final : public Stream {
 public:
  CpuStream(CpuDevice& device, std::string name);
  ~CpuStream() override;

  Device& device() override;
  const std::string& name() const override { return name_; }

  void enqueue_host(std::function<void()> fn) override { enqueue(std::move(fn), false); }
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void zero(void* dst, std::size_t bytes) override;
  // The reference is dropped on the worker thread once the stream reaches this point.
  void retain_until_done(std::shared_ptr<const void> object) override {
    enqueue([o = std::move(object)] {}, true);
  }
  void gemm(const GemmArgs& args) override;
  void prepare_gemm(const GemmShape& shape) override;  // recorded in the device's GemmChoices
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

  void trace_begin(std::string name, std::string category, TraceArgs args) override;
  void trace_end() override;
  void set_trace(TraceRecorder* recorder, int pid, std::string tid) override;

  // `always`: run even after an earlier task failed (event records/waits, collectives,
  // trace markers), so other streams and ranks never wait forever on a failed stream.
  void enqueue(std::function<void()> fn, bool always);

 private:
  struct Task {
    std::function<void()> fn;
    bool always;
  };
  struct OpenSpan {
    std::string name, category;
    TraceArgs args;
    double start_us;
  };
  void worker_loop();

  CpuDevice& device_;
  std::string name_;
  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Task> queue_;
  std::size_t pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  // Tracing: set before work is enqueued (set_trace); spans are opened/closed on the worker.
  TraceRecorder* trace_ = nullptr;
  int trace_pid_ = 0;
  std::string trace_tid_;
  std::vector<OpenSpan> open_spans_;  // worker thread only
  std::thread worker_;
};

CpuStream& as_cpu_stream(Stream& stream);  // asserts the stream belongs to the CPU backend
CpuEvent& as_cpu_event(Event& event);

}  // namespace stp
