// CudaDevice, CudaStream, CudaEvent: core/device.h on the CUDA runtime.
//
// Ordering arguments (the same contract the CPU backend tests prove):
//   * every Stream is a non-blocking cudaStream_t, so it never synchronizes implicitly with the
//     legacy default stream; all cross-stream order comes from record()/wait() on cudaEvent_t;
//   * copies are cudaMemcpyAsync(cudaMemcpyDefault) (unified addressing): asynchronous only
//     between device memory and pinned host memory, which is why offload buffers come from
//     allocate_pinned_host (cudaHostAlloc), never from pageable memory;
//   * every GEMM is a cublasLtMatmul on the stream's cudaStream_t (one cuBLASLt handle and algorithm
//     cache per device, core/cuda/lt_gemm.h), so GEMMs are ordered with the stream's other work; a
//     stream's workspace is its own (set_gemm_workspace: the trainer gives the compute stream one
//     from its arena), so streams never share one;
//   * every call that enqueues work first makes the stream's GPU current on the calling thread
//     (CudaStream::bind): CUDA's current device is per host thread, the trainer drives each rank
//     from a fresh thread every step, and kernel launches, cuBLAS calls and event records on a
//     stream of another device fail (CUDA Programming Guide, "Stream and Event Behavior");
//     the call is skipped when the thread's cached current GPU is already the stream's
//     (cuda::set_device, core/cuda/cuda_check.h), so a launch costs no cudaSetDevice;
//   * queries (cudaEventQuery, cudaStreamQuery) that answer cudaErrorNotReady also leave it as the
//     thread's last error: gpu::after_query takes it, and the launch check drops a stale NotReady
//     and never blames an earlier error on a launch (finding 1, docs/gpu-readiness.md section 8);
//   * after a sticky error (an illegal address...) the GPU is poisoned (gpu::device_health()):
//     release paths (free, fence records and waits, event queries, destroy) do nothing, so
//     destructors never throw; work paths throw the first error (finding 2);
//   * host tasks (enqueue_host) run on CUDA's callback thread: an exception there is captured and
//     rethrown by the stream's next synchronize(), as on the CPU backend (it cannot cross the
//     callback boundary). Unlike the CPU backend, later work on the stream still runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_attention.h"
#include "core/cuda/cudnn_library.h"
#include "core/cuda/lt_gemm.h"
#include "core/kernels/gemm_kernels.h"
#include "core/launch.h"
#include "base/trace.h"

namespace stp {

namespace {

class CudaDevice;

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, bool timing) : ordinal_(ordinal) {
    if (gpu::device_health().poisoned()) return;  // a fence made while tearing down: a null event
    cuda::set_device(ordinal_);
    STP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override {
    if (event_) (void)cudaEventDestroy(event_);  // safe with a pending record
  }
  // Release paths: with a poisoned GPU nothing will complete any more; report "done" so fences
  // and the arena's teardown go on (the first error has been thrown where it happened).
  bool query() override {
    if (gpu::device_health().poisoned() || !event_) return true;
    cudaError_t e = cudaEventQuery(event_);
    if (gpu::after_query(e, cuda::last_error()) == gpu::QueryState::NotReady) return false;
    STP_CUDA_CHECK(e);
    return true;
  }
  void synchronize() override {
    if (gpu::device_health().poisoned() || !event_) return;
    STP_CUDA_CHECK(cudaEventSynchronize(event_));
  }
  // cudaErrorNotReady (a record still pending) and cudaErrorInvalidResourceHandle (an event
  // without timing) throw, as the contract says; the CPU backend asserts the same.
  double elapsed_ms(Event& start) override;
  cudaEvent_t handle() const { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_{};
};

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice& device, int ordinal, std::string name);
  ~CudaStream() override;

  Device& device() override;
  const std::string& name() const override { return name_; }
  cudaStream_t handle() const { return stream_; }

  void enqueue_host(std::function<void()> fn) override {
    gpu::device_health().check_usable();
    bind();
    auto task = std::make_unique<HostTask>(HostTask{std::move(fn), this});
    STP_CUDA_CHECK(cudaLaunchHostFunc(stream_, &CudaStream::run_host_fn, task.get()));
    (void)task.release();  // owned by the callback from here on
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (!bytes) return;
    gpu::device_health().check_usable();
    bind();
    STP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  // CUDA forbids CUDA calls (cudaFree) inside host callbacks, so the reference is parked with an
  // event and dropped on the host at a later call once the event has completed.
  void retain_until_done(std::shared_ptr<const void> object) override {
    if (gpu::device_health().poisoned()) return;  // release path: the object is dropped now
    bind();  // the event below is created on the current device and recorded on this stream
    reap_retained(false);
    cudaEvent_t e{};
    STP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    STP_CUDA_CHECK(cudaEventRecord(e, stream_));
    retained_.push_back({e, std::move(object)});
  }
  void reap_retained(bool all) {
    while (!retained_.empty()) {
      if (gpu::device_health().poisoned()) {  // nothing completes any more: drop everything
        retained_.clear();
        return;
      }
      cudaError_t q = all ? cudaEventSynchronize(retained_.front().first) : cudaEventQuery(retained_.front().first);
      if (gpu::after_query(q, cuda::last_error()) == gpu::QueryState::NotReady) return;
      STP_CUDA_CHECK(q);
      (void)cudaEventDestroy(retained_.front().first);
      retained_.pop_front();
    }
  }
  void zero(void* dst, std::size_t bytes) override {
    if (!bytes) return;
    gpu::device_health().check_usable();
    bind();
    device().count_launch();
    STP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void gemm(const GemmArgs& g) override;
  void set_gemm_workspace(void* ptr, std::size_t bytes) override {
    gemm_workspace_ = ptr;
    gemm_workspace_bytes_ = ptr ? bytes : 0;
  }
  void prepare_gemm(const GemmShape& shape) override;
  void set_attention_workspace(void* ptr, std::size_t bytes) override {
    attention_workspace_ = ptr;
    attention_workspace_bytes_ = ptr ? bytes : 0;
  }
  bool prepare_attention(const AttentionShape& shape) override;
  bool library_attention_forward(const AttentionForwardArgs& args) override;
  bool library_attention_backward(const AttentionBackwardArgs& args) override;
  // Release paths too (the arena records a fence when a buffer is freed, from destructors).
  void record(Event& event) override {
    gpu::device_health().release([&] {
      bind();
      STP_CUDA_CHECK(cudaEventRecord(as_cuda(event).handle(), stream_));
    });
  }
  void wait(Event& event) override {
    gpu::device_health().release([&] {
      bind();
      STP_CUDA_CHECK(cudaStreamWaitEvent(stream_, as_cuda(event).handle(), 0));
    });
  }
  void synchronize() override {
    gpu::device_health().check_usable();
    bind();
    // Polls instead of cudaStreamSynchronize: a stream behind an NCCL kernel whose peer failed
    // would wait for ever, so between queries the GPU's communicators are checked for
    // asynchronous errors (a failed peer or network); one aborts its communicator, which ends the kernel, and throws.
    for (int spins = 0;; ++spins) {
      cudaError_t q = cudaStreamQuery(stream_);
      gpu::QueryState state = gpu::after_query(q, cuda::last_error());
      if (state == gpu::QueryState::Done) break;
      if (state == gpu::QueryState::Failed) STP_CUDA_CHECK(q);
      if (spins % 64 == 63) nccl_poll_async_errors(ordinal_);
      if (spins < 256) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    reap_retained(true);
    flush_trace();
    std::exception_ptr host_error;
    {
      std::lock_guard<std::mutex> lock(host_error_mu_);
      std::swap(host_error, host_error_);
    }
    if (host_error) std::rethrow_exception(host_error);
  }
  // Makes this stream's GPU the calling thread's current device (no CUDA call when it already is).
  void bind() const { cuda::set_device(ordinal_); }
  void trace_begin(std::string span_name, std::string category, TraceArgs args) override;
  void trace_end() override;
  void set_trace(TraceRecorder* recorder, int pid, std::string tid) override;

 private:
  struct HostTask {
    std::function<void()> fn;
    CudaStream* stream;  // outlives the task: ~CudaStream synchronizes first
  };
  // Exceptions cannot cross the CUDA callback boundary: the first one is kept for synchronize().
  // The task (and what it captured) is destroyed here, so it must not own CUDA resources.
  static void CUDART_CB run_host_fn(void* data) {
    std::unique_ptr<HostTask> task(static_cast<HostTask*>(data));
    try {
      task->fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(task->stream->host_error_mu_);
      if (!task->stream->host_error_) task->stream->host_error_ = std::current_exception();
    }
  }
  static CudaEvent& as_cuda(Event& e) {
    auto* c = dynamic_cast<CudaEvent*>(&e);
    STP_ASSERT(c, "event is not a CUDA event");
    return *c;
  }
  cudaEvent_t timing_event();
  void flush_trace();

  struct Span {
    std::string name, category;
    TraceArgs args;
    cudaEvent_t begin{}, end{};
  };
  CudaDevice& device_;
  int ordinal_;
  std::string name_;
  cudaStream_t stream_{};
  void* gemm_workspace_ = nullptr;  // cuBLASLt's scratch: the caller's (set_gemm_workspace), or none
  std::size_t gemm_workspace_bytes_ = 0;
  void* attention_workspace_ = nullptr;  // cuDNN attention's scratch (set_attention_workspace), or none
  std::size_t attention_workspace_bytes_ = 0;
  // Tracing: spans are timed with CUDA events against a reference event whose host time is known.
  TraceRecorder* trace_ = nullptr;
  int trace_pid_ = 0;
  std::string trace_tid_;
  cudaEvent_t reference_{};
  double reference_us_ = 0;
  std::vector<Span> open_, closed_;
  std::deque<std::pair<cudaEvent_t, std::shared_ptr<const void>>> retained_;
  std::mutex host_error_mu_;
  std::exception_ptr host_error_;  // first exception of a host task, rethrown by synchronize()
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::size_t capacity) : ordinal_(ordinal), budget_(capacity) {
    cuda::set_device(ordinal_);
    std::size_t free_bytes = 0, total = 0;
    STP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    device_.capacity = capacity < free_bytes ? capacity : free_bytes;
    total_bytes_ = total;
    pinned_.capacity = SIZE_MAX;
    cudaDeviceProp prop{};
    STP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
    name_ = str("cuda:", ordinal_, " (", prop.name, ")");
    gemm_ = std::make_unique<LtGemm>(ordinal_);
    // The GPU's NUMA node (the pinned pool and the rank's host thread go there): its PCI device's numa_node in sysfs.
    // Unknown (-1) on one-node machines and where sysfs is not visible; memory/numa.h then falls back to a CPU-side
    // answer.
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal_) == cudaSuccess) numa_node_ = pci_numa_node(bus_id);
    else (void)cudaGetLastError();
  }
  int numa_node_hint() const override { return numa_node_; }
  std::optional<std::size_t> physical_free_bytes() const override {
    cuda::set_device(ordinal_);
    std::size_t free_bytes = 0, total = 0;
    STP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
  }
  ~CudaDevice() override {
    cuda::set_device_quietly(ordinal_);
    for (auto& [p, b] : live_) (void)cudaFree(p);
    for (auto& [p, b] : pinned_live_) (void)(registered_.count(p) ? cudaHostUnregister(p) : cudaFreeHost(p));
  }

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  int index() const override { return ordinal_; }
  std::string name() const override { return name_; }

  void* allocate(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    cuda::set_device(ordinal_);
    // Capacity is measured at every allocation, not only when the device was made: the CUDA
    // context, the cuBLASLt handle and NCCL's buffers are allocated in between, outside memory.device_budget
    // (docs/gpu-readiness.md, Memory). The arena's first allocation (the whole budget, taken while the trainer is
    // built) comes after all of them.
    std::size_t free_bytes = 0, total = 0;
    STP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    device_.capacity = std::min(budget_, device_.in_use + free_bytes);
    if (bytes > device_.capacity - device_.in_use)
      throw oom(bytes, budget_ - device_.in_use >= bytes ? "GPU" : "limit", free_bytes);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw oom(bytes, "GPU", free_bytes);
    }
    STP_CUDA_CHECK(e);
    account(device_, live_, p, bytes);
    return p;
  }
  void deallocate(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    unaccount(device_, live_, p);
    gpu::device_health().release([&] {
      cuda::set_device(ordinal_);
      STP_CUDA_CHECK(cudaFree(p));
    });
  }
  MemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return device_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    device_.peak = device_.in_use;
    pinned_.peak = pinned_.in_use;
  }
  void* allocate_pinned_host(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    cuda::set_device(ordinal_);
    // Never silently pageable: a failure to pin is an error with CUDA's message.
    STP_CUDA_CHECK(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
    account(pinned_, pinned_live_, p, bytes);
    return p;
  }
  void deallocate_pinned_host(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    STP_ASSERT(!registered_.count(p), "cudaFreeHost of registered host memory (use unregister_pinned_host)");
    unaccount(pinned_, pinned_live_, p);
    gpu::device_health().release([&] { STP_CUDA_CHECK(cudaFreeHost(p)); });
  }
  // The caller mapped, NUMA-bound and pre-faulted the range (memory/pinned_pool.cpp): pinning it
  // now keeps the pages where they are. Portable: pinned for every GPU's context, like
  // cudaHostAllocPortable.
  void register_pinned_host(void* p, std::size_t bytes) override {
    STP_ASSERT(p && bytes > 0, "registering an empty host range");
    std::lock_guard<std::mutex> lock(mu_);
    cuda::set_device(ordinal_);
    STP_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
    account(pinned_, pinned_live_, p, bytes);
    registered_.insert(p);
  }
  void unregister_pinned_host(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    STP_ASSERT(registered_.erase(p) == 1, "unregistering host memory that was not registered");
    unaccount(pinned_, pinned_live_, p);
    gpu::device_health().release([&] { STP_CUDA_CHECK(cudaHostUnregister(p)); });
  }
  MemoryStats pinned_host_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_;
  }
  std::unique_ptr<Stream> create_stream(std::string stream_name) override {
    return std::make_unique<CudaStream>(*this, ordinal_, std::move(stream_name));
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(ordinal_, false); }
  std::unique_ptr<Event> create_timing_event() override { return std::make_unique<CudaEvent>(ordinal_, true); }

  LtGemm& lt_gemm() { return *gemm_; }
  // The device's cuDNN attention (made on first use, the device current), or null when the
  // process's cuDNN is unusable (cudnn_status() has printed why, once) or its handle could not be
  // made on this GPU (one line, here).
  CudnnAttention* cudnn_attention() {
    std::lock_guard<std::mutex> lock(attention_mu_);
    if (!attention_ && !attention_failed_ && cudnn_status().usable) {
      cuda::set_device(ordinal_);
      try {
        attention_ = std::make_unique<CudnnAttention>(ordinal_);
      } catch (const InternalError& e) {
        attention_failed_ = true;
        std::fprintf(stderr, "stp: cuDNN not usable on %s (%s); fused attention runs stp's own CUDA kernel\n",
                     name_.c_str(), e.what());
      }
    }
    return attention_.get();
  }

 private:
  // who: "limit" (memory.device_budget is exhausted) or "GPU" (the GPU itself has no room: the
  // report says what lies outside the budget and what to change).
  OutOfMemoryError oom(std::size_t bytes, const char* who, std::size_t free_bytes) const {
    std::string what = str(name_, ": out of device memory (", who, "): requested ", format_bytes(bytes), ", in use ",
                           format_bytes(device_.in_use), ", capacity ", format_bytes(device_.capacity), ", peak ",
                           format_bytes(device_.peak));
    if (std::string(who) == "GPU")
      what += str(
          "; the GPU has ", format_bytes(free_bytes), " free of ", format_bytes(total_bytes_),
          ". Outside memory.device_budget: the CUDA context, the cuBLASLt and cuDNN handles, NCCL's buffers and other "
          "processes on this GPU (nvidia-smi). Lower memory.device_budget to at most ",
          format_bytes(device_.in_use + free_bytes),
          " less some room for NCCL (connections made at the "
          "first transfer allocate more)");
    return OutOfMemoryError(what, bytes);
  }
  static void account(MemoryStats& s, std::map<void*, std::size_t>& live, void* p, std::size_t bytes) {
    live[p] = bytes;
    s.in_use += bytes;
    if (s.in_use > s.peak) s.peak = s.in_use;
    ++s.alloc_count;
  }
  static void unaccount(MemoryStats& s, std::map<void*, std::size_t>& live, void* p) {
    auto it = live.find(p);
    STP_ASSERT(it != live.end(), "free of a pointer that is not a live allocation");
    s.in_use -= it->second;
    ++s.free_count;
    live.erase(it);
  }

  int ordinal_;
  std::size_t budget_;            // memory.device_budget (SIZE_MAX: none)
  std::size_t total_bytes_ = 0;   // the GPU's memory
  std::unique_ptr<LtGemm> gemm_;  // every stream's GEMMs: one handle, one algorithm cache
  std::mutex attention_mu_;
  bool attention_failed_ = false;              // cudnnCreate failed on this GPU: stp's own kernel runs
  std::unique_ptr<CudnnAttention> attention_;  // every stream's library attention: one handle, one plan cache
  int numa_node_ = -1;
  std::string name_;
  mutable std::mutex mu_;
  MemoryStats device_, pinned_;
  std::map<void*, std::size_t> live_, pinned_live_;
  std::set<void*> registered_;  // pinned_live_ entries from register_pinned_host
};

CudaStream::CudaStream(CudaDevice& device, int ordinal, std::string name)
    : device_(device), ordinal_(ordinal), name_(std::move(name)) {
  cuda::set_device(ordinal_);
  STP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  cuda::set_device_quietly(ordinal_);
  (void)cudaStreamSynchronize(stream_);
  for (auto& [e, o] : retained_) (void)cudaEventDestroy(e);
  retained_.clear();
  for (auto& s : closed_) {
    (void)cudaEventDestroy(s.begin);
    (void)cudaEventDestroy(s.end);
  }
  if (reference_) (void)cudaEventDestroy(reference_);
  (void)cudaStreamDestroy(stream_);
}

Device& CudaStream::device() { return device_; }

double CudaEvent::elapsed_ms(Event& start) {
  auto* s = dynamic_cast<CudaEvent*>(&start);
  STP_ASSERT(s, "event is not a CUDA event");
  float ms = 0;
  STP_CUDA_CHECK(cudaEventElapsedTime(&ms, s->event_, event_));
  return static_cast<double>(ms);
}

void CudaStream::gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  gpu::device_health().check_usable();
  bind();          // the cuBLASLt handle belongs to this stream's device
  if (g.k == 0) {  // C = beta·C: no product for cuBLASLt to run
    gemm_scale_output(*this, g);
    return;
  }
  note_gemm(g);
  device().count_launch();
  if (device_.lt_gemm().run(stream_, g, gemm_workspace_, gemm_workspace_bytes_)) device().count_late_gemm_choice();
}

void CudaStream::prepare_gemm(const GemmShape& shape) {
  gpu::device_health().check_usable();
  bind();
  device_.lt_gemm().prepare(shape, gemm_workspace_bytes_);
}

// The library attention: cuDNN in bf16 where the process loaded a usable cuDNN and the shape's
// plans exist (core/cuda/cudnn_attention.h); false otherwise, and the caller runs stp's own kernel.
bool CudaStream::prepare_attention(const AttentionShape& shape) {
  if (shape.type != DType::Bf16) return false;
  gpu::device_health().check_usable();
  bind();
  CudnnAttention* a = device_.cudnn_attention();
  return a && a->prepare(shape, attention_workspace_bytes_);
}

bool CudaStream::library_attention_forward(const AttentionForwardArgs& args) {
  if (!prepare_attention(args.shape)) return false;
  device().count_launch();
  device_.cudnn_attention()->forward(stream_, args, attention_workspace_, attention_workspace_bytes_);
  return true;
}

bool CudaStream::library_attention_backward(const AttentionBackwardArgs& args) {
  if (!prepare_attention(args.shape)) return false;
  device().count_launch();
  device_.cudnn_attention()->backward(stream_, args, attention_workspace_, attention_workspace_bytes_);
  return true;
}

cudaEvent_t CudaStream::timing_event() {
  bind();
  cudaEvent_t e{};
  STP_CUDA_CHECK(cudaEventCreate(&e));
  STP_CUDA_CHECK(cudaEventRecord(e, stream_));
  return e;
}

void CudaStream::set_trace(TraceRecorder* recorder, int pid, std::string tid) {
  synchronize();
  trace_ = recorder;
  trace_pid_ = pid;
  trace_tid_ = std::move(tid);
  if (!trace_) return;
  if (!reference_) reference_ = timing_event();
  else STP_CUDA_CHECK(cudaEventRecord(reference_, stream_));
  STP_CUDA_CHECK(cudaEventSynchronize(reference_));
  reference_us_ = trace_->now_us();
}

void CudaStream::trace_begin(std::string span_name, std::string category, TraceArgs args) {
  if (!trace_) return;
  open_.push_back(Span{std::move(span_name), std::move(category), std::move(args), timing_event(), {}});
}

void CudaStream::trace_end() {
  if (!trace_) return;
  STP_ASSERT(!open_.empty(), "trace_end without trace_begin on stream ", name_);
  Span s = std::move(open_.back());
  open_.pop_back();
  s.end = timing_event();
  closed_.push_back(std::move(s));
}

void CudaStream::flush_trace() {
  for (auto& s : closed_) {
    float begin_ms = 0, end_ms = 0;
    STP_CUDA_CHECK(cudaEventElapsedTime(&begin_ms, reference_, s.begin));
    STP_CUDA_CHECK(cudaEventElapsedTime(&end_ms, reference_, s.end));
    trace_->add(TraceSpan{trace_pid_, trace_tid_, std::move(s.name), std::move(s.category), std::move(s.args),
                          reference_us_ + 1e3 * begin_ms, 1e3 * (end_ms - begin_ms)});
    (void)cudaEventDestroy(s.begin);
    (void)cudaEventDestroy(s.end);
  }
  closed_.clear();
}

}  // namespace

void* cuda_stream_handle(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  STP_ASSERT(s, "stream '", stream.name(), "' is not a CUDA stream");
  gpu::device_health().check_usable();
  s->bind();  // launch() and NCCL enqueue on this handle next: its device must be current
  return s->handle();
}

void cuda_check_before_launch(const char* kernel_name) { gpu::before_launch(cuda::last_error(), kernel_name); }

void cuda_check_launch(const char* kernel_name) { gpu::after_launch(cuda::last_error(), kernel_name); }

// Lazy module loading (the default from CUDA 12.2 when CUDA_MODULE_LOADING is unset) loads a
// kernel's module at its first launch, which can wait behind NCCL kernels spinning on a peer
// (finding 5). stp asks for eager loading before the runtime initialises: every kernel of the
// binary is loaded with the context (CUDA C++ Programming Guide, Lazy Loading). A value the user
// set is kept (CUDA_MODULE_LOADING=LAZY to trade the risk for start-up time).
void force_eager_module_loading() { (void)setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0); }

int cuda_visible_gpus() {
  force_eager_module_loading();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_device_name(int ordinal) {
  cudaDeviceProp prop{};
  STP_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  return prop.name;
}

bool cuda_devices_usable(int needed, std::string* why) {
  force_eager_module_loading();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    // Without libcuda the runtime says "driver version is insufficient", which misleads: the
    // driver's own version (0 = no driver loaded) tells the two cases apart.
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    (void)cudaGetLastError();
    if (!why) return false;
    if (driver == 0)
      *why = "no NVIDIA driver was found (libcuda.so.1 could not be loaded; nvidia-smi shows whether one is installed)";
    else if (e == cudaErrorInsufficientDriver)
      *why = str("the NVIDIA driver supports CUDA ", driver / 1000, ".", driver % 1000 / 10,
                 ", older than this stp's CUDA runtime ", CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10,
                 " (update the driver)");
    else *why = str("no usable GPU (cudaGetDeviceCount: ", cudaGetErrorString(e), ")");
    return false;
  }
  if (count < needed) {
    if (why) *why = str(count, " GPU(s) visible, ", needed, " needed (one per rank)");
    return false;
  }
  return true;
}

std::vector<std::unique_ptr<Device>> make_cuda_devices(int count, std::size_t capacity, int first) {
  std::vector<std::unique_ptr<Device>> out;
  for (int i = first; i < first + count; ++i) out.push_back(std::make_unique<CudaDevice>(i, capacity));
  return out;
}

}  // namespace stp
