// The device runtime, drawn at three levels (docs/style.md, Device runtime: three levels):
//
//   Device — a compute device with a hard memory capacity: allocates device memory and pinned
//            host memory (the host buffer type that async copies need), creates streams/events.
//   Stream — an in-order queue: host tasks, kernels (core/launch.h), GEMM, async copies,
//            event record / wait, synchronize. Everything enqueued is asynchronous to the caller.
//   Event  — a point in a stream: recorded on one stream, waited on by another stream
//            (a stream wait, not a host wait) or by the host, and queried.
//
// Semantics follow CUDA exactly, so code written against this interface runs unchanged on
// CpuDevice (core/cpu) and CudaDevice (core/cuda):
//   * Stream::wait(e) waits for the *most recent* record of e made before the call; waiting on
//     a never-recorded event is a no-op.
//   * A buffer passed to an async operation must stay alive and unmodified (source) or unread
//     (destination) until an event recorded after that operation has completed.
//   * An exception thrown by stream work is captured; later work on that stream is skipped,
//     event records still complete (so no other stream hangs), and the error is rethrown by the
//     next Stream::synchronize().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "base/trace.h"
#include "core/dtype.h"

namespace stp {

class Stream;
class Event;
struct GemmShape;  // core/gemm_shape.h
class GemmLog;     // core/gemm_shape.h

enum class DeviceKind { Cpu, Cuda };

const char* to_string(DeviceKind kind);

// The NUMA node of a PCI device from sysfs: `<sysfs>/<bus id>/numa_node`, the bus id as
// cudaDeviceGetPCIBusId writes it ("0000:3B:00.0"; sysfs names are lower case). -1 when the file
// is missing or unreadable, or holds -1 (no NUMA affinity: a one-node machine).
int pci_numa_node(const std::string& pci_bus_id, const std::string& sysfs = "/sys/bus/pci/devices");

// Exact byte counts of one memory space of a device (device memory or pinned host memory).
struct MemoryStats {
  std::size_t capacity = 0;  // hard limit (bytes); SIZE_MAX = unlimited
  std::size_t in_use = 0;    // bytes currently allocated
  std::size_t peak = 0;      // high-water mark of in_use since creation / reset_peak()
  std::uint64_t alloc_count = 0;
  std::uint64_t free_count = 0;
};

// Row-major GEMM, the one BLAS operation of the runtime:
//   C(M,N) = alpha * op(A) * op(B) + beta * C,  op(X) = X or X^T.
// A is (M,K) if !trans_a else (K,M), leading dimension lda; same for B (K,N)/(N,K) and C (M,N).
// Types: A and B are both `ab` (f32 or bf16), C is `c` (f32, or bf16 with bf16 inputs); products
// and sums are f32 on every backend (cuBLASLt: CUBLAS_COMPUTE_32F, f32 scale); a bf16 C with beta 0
// is rounded once from the f32 sum (beta != 0 may round twice on CUDA: docs/gpu-readiness.md, cuBLAS).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  float beta = 0.0f;
  void* c = nullptr;
  int ldc = 0;
  DType ab = DType::F32;
  DType c_type = DType::F32;
};

// Bytes of GEMM workspace a compute stream of a `kind` device gets (Stream::set_gemm_workspace):
// 32 MiB on CUDA (cuBLASLt's split-K partials and its recommended size from Hopper on; a fixed size
// for every GPU, so a plan made on the dry-run devices counts exactly what the GPU run allocates),
// 0 on the CPU backend, whose GEMM needs none. The trainer takes it from the rank's arena while it
// is built, so the memory plan and the measured peak both hold it.
std::size_t gemm_workspace_bytes(DeviceKind kind);

// Causal self-attention run by a library kernel (CUDA: cuDNN's fused flash attention), the same
// problem as core/kernels/attention_kernels.h's fused kernel: element (b, t, head, d) of q at
// q[(b*T + t)*ldq + head*D + d], k and v with ldkv and NKV heads (NKV divides NH; query head h
// reads k/v head h / (NH / NKV)), o and do with ldo, dq/dk/dv laid out like q/k/v; scores scaled by
// 1/sqrt(D) and masked to keys j <= i; lse (B, NH, T) f32, row (b, h, t) at (b*NH + h)*T + t, the
// natural log-sum-exp of each query row's scaled, masked scores. f32 products, sums and softmax;
// each bf16 output rounded once.
struct AttentionShape {
  std::int64_t B = 0, T = 0, NH = 0, NKV = 0, D = 0;
  std::int64_t ldq = 0, ldkv = 0, ldo = 0;  // row strides in elements
  DType type = DType::F32;                  // q, k, v, o and their gradients
  auto tie() const { return std::tie(B, T, NH, NKV, D, ldq, ldkv, ldo, type); }
  bool operator<(const AttentionShape& o) const { return tie() < o.tie(); }
  bool operator==(const AttentionShape& o) const { return tie() == o.tie(); }
};

struct AttentionForwardArgs {
  AttentionShape shape;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

// row_dot: B*NH*T f32 of device scratch the call may overwrite (do . o per query row).
struct AttentionBackwardArgs {
  AttentionShape shape;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  const float* lse = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float* row_dot = nullptr;
};

// Bytes of attention-library workspace a compute stream of a `kind` device gets when the run uses
// the fused attention in bf16 (Stream::set_attention_workspace): 512 MiB on CUDA (cuDNN's fused
// flash attention, whose deterministic backward keeps a dP tile set per (batch, head): 2 B H T^2
// bytes; a fixed size so a plan made on the dry-run devices counts exactly what the GPU run
// allocates; engines that need more are not used), 0 on the CPU backend, which has no library path.
std::size_t attention_workspace_bytes(DeviceKind kind);

class Event {
 public:
  virtual ~Event() = default;
  // True when the most recent record has completed (or there was none).
  virtual bool query() = 0;
  // Blocks the calling host thread until the most recent record (at call time) has completed.
  virtual void synchronize() = 0;
  // Device time in milliseconds from `start`'s most recent record to this event's most recent
  // record (CUDA: cudaEventElapsedTime); negative when this one was reached first. Both events
  // must come from Device::create_timing_event, both must have been recorded, and both records
  // must have completed (query() true); otherwise it throws. Measures stream work without a
  // host task on the stream (a host callback would make a CUDA stream wait for the driver).
  virtual double elapsed_ms(Event& start) = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual class Device& device() = 0;
  virtual const std::string& name() const = 0;

  // Runs fn on the host in stream order (CUDA: cudaLaunchHostFunc; fn must not call CUDA).
  virtual void enqueue_host(std::function<void()> fn) = 0;
  // Async copy of `bytes` between any two buffers of this device or its pinned host memory.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Keeps `object` (e.g. a tensor's storage) alive until all work enqueued so far has finished,
  // then drops this reference: stream-ordered release of buffers that in-flight work still uses.
  virtual void retain_until_done(std::shared_ptr<const void> object) = 0;
  // Async memset of device memory to zero bytes.
  virtual void zero(void* dst, std::size_t bytes) = 0;
  virtual void gemm(const GemmArgs& args) = 0;
  // Device memory this stream's GEMMs may use as scratch, `bytes` of it at `ptr` (CUDA: cuBLASLt's
  // workspace, which lets it pick split-K algorithms; the CPU backend uses none and ignores it). Set
  // once, before the stream's first GEMM; the memory must outlive every GEMM enqueued on the
  // stream. A stream without one still runs every GEMM, with algorithms that need no workspace.
  virtual void set_gemm_workspace(void* ptr, std::size_t bytes) {
    (void)ptr;
    (void)bytes;
  }
  // Chooses, now, the algorithm of every later GEMM of `shape` (core/gemm_shape.h: trans, m, n, k,
  // ld*, types, pointer alignments) on this stream (CUDA: the cuBLASLt heuristic, cached per device
  // with the stream's workspace size). The first GEMM of a shape nobody prepared chooses it itself,
  // a late choice the device counts (Device::late_gemm_choices). The CPU backend runs no heuristic
  // but keeps the same record per device, so it counts the same late choices.
  virtual void prepare_gemm(const GemmShape& shape) { (void)shape; }
  // From now on, adds the shape of every GEMM enqueued on this stream that reaches the library
  // (m, n and k positive) to `log` (null: stop), on every backend and in a dry run; the caller keeps
  // `log` alive while it is set. Trainers record a dry step's GEMMs with it to prepare them.
  void set_gemm_log(GemmLog* log) { gemm_log_ = log; }

  // Attention through a library kernel (AttentionShape above), an optional capability: a stream
  // that has none (the CPU backend, f32, a GPU without a usable cuDNN, a shape the library
  // refuses) answers false and enqueues nothing, and the caller runs stp's own kernel
  // (core/kernels/attention_kernels.h). prepare_attention chooses, now, the plans of `shape`
  // (CUDA: builds cuDNN's forward and backward graphs and picks deterministic engines whose
  // workspace fits the stream's) and says whether the library runs it; the first call of an
  // unprepared shape prepares it itself. The answer for a shape never changes afterwards.
  virtual bool prepare_attention(const AttentionShape& shape) {
    (void)shape;
    return false;
  }
  virtual bool library_attention_forward(const AttentionForwardArgs& args) {
    (void)args;
    return false;
  }
  virtual bool library_attention_backward(const AttentionBackwardArgs& args) {
    (void)args;
    return false;
  }
  // Device memory the stream's library attention may use as scratch (as set_gemm_workspace; one
  // buffer serves forward and backward, which run in stream order). Set before prepare_attention.
  virtual void set_attention_workspace(void* ptr, std::size_t bytes) {
    (void)ptr;
    (void)bytes;
  }

  virtual void record(Event& event) = 0;
  virtual void wait(Event& event) = 0;
  // Blocks until all enqueued work has finished; rethrows the first error of stream work.
  virtual void synchronize() = 0;

  // Tracing: a span covers the stream work enqueued between begin and end; its time is the
  // time that work ran on the device. No-op unless a recorder is attached. The stream (`tid`),
  // category and argument names are base/trace_names.h's.
  virtual void trace_begin(std::string name, std::string category, TraceArgs args = {}) = 0;
  virtual void trace_end() = 0;
  virtual void set_trace(TraceRecorder* recorder, int pid, std::string tid) = 0;

 protected:
  // Every backend's gemm() calls it first: the GemmLog record above.
  void note_gemm(const GemmArgs& g);

 private:
  GemmLog* gemm_log_ = nullptr;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual int index() const = 0;
  virtual std::string name() const = 0;
  // The NUMA node the device is attached to, as the hardware reports it (CUDA: the GPU's PCI
  // device in sysfs), or -1 when unknown; memory/numa.h falls back to a CPU-side answer then.
  virtual int numa_node_hint() const { return -1; }

  // Device memory. allocate() throws OutOfMemoryError naming requested, in use, capacity, peak.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak() = 0;
  // Memory the hardware reports free right now, allocator or not (CUDA: cudaMemGetInfo), or
  // nullopt where there is no such thing (the CPU backend's emulated devices). The trainer measures
  // what libraries take outside the budget (NCCL's communicators) as the difference of two reads.
  virtual std::optional<std::size_t> physical_free_bytes() const { return std::nullopt; }

  // Pinned (page-locked) host memory for async copies. Never silently pageable: a failure to
  // pin is an error. On the CPU backend pinned memory is host memory (mlock-ed when allowed).
  virtual void* allocate_pinned_host(std::size_t bytes) = 0;
  virtual void deallocate_pinned_host(void* ptr) = 0;
  // Pins `bytes` of host memory the caller allocated and placed (CUDA: cudaHostRegister), counted
  // in pinned_host_stats like allocate_pinned_host. Pinned pages no longer move, so a caller that
  // wants them on a NUMA node maps, binds and pre-faults them first, then registers (the pinned
  // pool does). The caller frees the memory after unregister_pinned_host.
  virtual void register_pinned_host(void* ptr, std::size_t bytes) = 0;
  virtual void unregister_pinned_host(void* ptr) = 0;
  virtual MemoryStats pinned_host_stats() const = 0;

  virtual std::unique_ptr<Stream> create_stream(std::string name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // An event that also records when it was reached, for Event::elapsed_ms (CUDA: without
  // cudaEventDisableTiming, so slightly more expensive to record and wait on than create_event's).
  virtual std::unique_ptr<Event> create_timing_event() = 0;

  // Kernel launches enqueued on this device's streams since it was made: index launches and
  // launch shapes (core/launch.h), GEMMs (Stream::gemm: at least one cuBLAS kernel) and zero
  // fills (a memset kernel on CUDA). Copies, event records and host tasks are not launches.
  // The same work counts the same on every backend, so the CPU backend's count is the GPU's;
  // the trainer reports the difference over a step (StepResult::launches).
  std::uint64_t launch_count() const { return launches_.load(std::memory_order_relaxed); }
  void count_launch() { launches_.fetch_add(1, std::memory_order_relaxed); }
  // GEMM algorithms chosen by a GEMM itself on this device's streams, because no one prepared its
  // shape (Stream::prepare_gemm): each is a heuristic call inside a step on a GPU. A trainer
  // prepares every shape its steps run, so the count stays 0 (StepResult::late_gemm_choices).
  std::uint64_t late_gemm_choices() const { return late_gemm_choices_.load(std::memory_order_relaxed); }
  void count_late_gemm_choice() { late_gemm_choices_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> launches_{0};
  std::atomic<std::uint64_t> late_gemm_choices_{0};
};

}  // namespace stp
