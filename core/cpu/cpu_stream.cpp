#include "core/cpu/cpu_stream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/cpu/cpu_device.h"
#include "core/cpu/cpu_gemm.h"
#include "core/gemm_shape.h"
#include "core/kernels/gemm_kernels.h"
#include "base/error.h"
#include "base/trace.h"

namespace stp {

// ---- CpuEventState ----------------------------------------------------------------------

bool CpuEventState::query() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= recorded_;
}

std::uint64_t CpuEventState::mark_recorded() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++recorded_;
}

std::uint64_t CpuEventState::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

void CpuEventState::complete(std::uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation > completed_) {
    completed_ = generation;
    completed_at_ns_ =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
  }
  cv_.notify_all();
}

std::int64_t CpuEventState::completed_at_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  STP_ASSERT(recorded_ > 0, "elapsed time of an event that was never recorded");
  STP_ASSERT(completed_ >= recorded_, "elapsed time of an event whose record has not completed (query() first)");
  return completed_at_ns_;
}

double CpuEvent::elapsed_ms(Event& start) {
  CpuEvent& s = as_cpu_event(start);
  STP_ASSERT(timing_ && s.timing_, "elapsed time of an event not made by Device::create_timing_event");
  return static_cast<double>(state_->completed_at_ns() - s.state_->completed_at_ns()) * 1e-6;
}

void CpuEventState::wait_for(std::uint64_t generation) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= generation; });
}

// ---- CpuStream --------------------------------------------------------------------------

CpuStream::CpuStream(CpuDevice& device, std::string name)
    : device_(device), name_(std::move(name)), worker_([this] { worker_loop(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

Device& CpuStream::device() { return device_; }

void CpuStream::enqueue(std::function<void()> fn, bool always) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    STP_ASSERT(!stopping_, "enqueue on a stream that is being destroyed");
    queue_.push_back(Task{std::move(fn), always});
    ++pending_;
  }
  work_cv_.notify_one();
}

void CpuStream::worker_loop() {
  for (;;) {
    Task task;
    bool failed;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      failed = error_ != nullptr;
    }
    if (!failed || task.always) {
      try {
        task.fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    task.fn = nullptr;  // release captures before the stream reports idle
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) idle_cv_.notify_all();
    }
  }
}

void CpuStream::synchronize() {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return pending_ == 0; });
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void CpuStream::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  // The link model applies to device <-> pinned host transfers (the PCIe analogue).
  double rate = device_.options().link_bytes_per_s;
  bool over_link = rate > 0 && (device_.is_pinned_host(dst) != device_.is_pinned_host(src));
  enqueue(
      [dst, src, bytes, over_link, rate] {
        auto start = std::chrono::steady_clock::now();
        std::memcpy(dst, src, bytes);
        if (over_link) {
          auto min_time = std::chrono::duration<double>(static_cast<double>(bytes) / rate);
          std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(min_time));
        }
      },
      false);
}

void CpuStream::zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  device().count_launch();
  enqueue([dst, bytes] { std::memset(dst, 0, bytes); }, false);
}

void CpuStream::gemm(const GemmArgs& g) {
  STP_ASSERT(g.m >= 0 && g.n >= 0 && g.k >= 0, "negative GEMM dimension");
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // C = beta·C, the code the CUDA backend runs for it too
    gemm_scale_output(*this, g);
    return;
  }
  note_gemm(g);
  if (device_.gemm_choices().run(gemm_shape_of(g))) device_.count_late_gemm_choice();
  device().count_launch();
  enqueue([g] { cpu_gemm(g); }, false);
}

void CpuStream::prepare_gemm(const GemmShape& shape) { device_.gemm_choices().prepare(shape); }

void CpuStream::record(Event& event) {
  auto state = as_cpu_event(event).state();
  std::uint64_t generation = state->mark_recorded();
  enqueue([state, generation] { state->complete(generation); }, true);
}

void CpuStream::wait(Event& event) {
  auto state = as_cpu_event(event).state();
  std::uint64_t generation = state->latest();
  if (generation == 0) return;  // never recorded: nothing to wait for (CUDA semantics)
  enqueue([state, generation] { state->wait_for(generation); }, true);
}

void CpuStream::set_trace(TraceRecorder* recorder, int pid, std::string tid) {
  synchronize();  // spans already open on the worker belong to the old recorder
  trace_ = recorder;
  trace_pid_ = pid;
  trace_tid_ = std::move(tid);
}

void CpuStream::trace_begin(std::string span_name, std::string category, TraceArgs args) {
  if (!trace_) return;
  enqueue(
      [this, n = std::move(span_name), c = std::move(category), a = std::move(args)]() mutable {
        open_spans_.push_back(OpenSpan{std::move(n), std::move(c), std::move(a), trace_->now_us()});
      },
      true);
}

void CpuStream::trace_end() {
  if (!trace_) return;
  enqueue(
      [this] {
        STP_ASSERT(!open_spans_.empty(), "trace_end without trace_begin on stream ", name_);
        OpenSpan s = std::move(open_spans_.back());
        open_spans_.pop_back();
        double end = trace_->now_us();
        trace_->add(TraceSpan{trace_pid_, trace_tid_, std::move(s.name), std::move(s.category), std::move(s.args),
                              s.start_us, end - s.start_us});
      },
      true);
}

CpuStream& as_cpu_stream(Stream& stream) {
  auto* s = dynamic_cast<CpuStream*>(&stream);
  STP_ASSERT(s, "stream '", stream.name(), "' is not a CPU stream");
  return *s;
}

CpuEvent& as_cpu_event(Event& event) {
  auto* e = dynamic_cast<CpuEvent*>(&event);
  STP_ASSERT(e, "event is not a CPU event");
  return *e;
}

}  // namespace stp
