// Optimizer offload (memory.optimizer_offload): the AdamW update of one rank run by the CPU
// (optim/cpu_adamw.h) on state that lives in pinned host memory, fed and drained by two copy
// streams of the device.
//
// Host memory (pinned, Device::allocate_pinned_host through a DeviceAllocator): the moments
// exp_avg / exp_avg_sq of every span (allocated by the optimizer from allocator()), and per group
// one staging buffer for the parameters (its device-master elements) and one for the gradients
// (group elements); with speculation, the shadows (below). The device keeps only the parameters
// and gradients: no optimizer byte is device memory. A direct group (set_direct: parameter
// streaming, whose parameters and gradients are pinned host memory already) has no staging.
//
// Host masters (bf16 precision, ParamInfo::host_master): a span added with its device bf16 copy
// has its f32 master in allocator()'s memory, not on the device. Its master is not downloaded
// (the host copy is the truth): the CPU update runs on it in place, then rounds it to bf16 on the
// host (from_f32<bf16>, the function the device's convert kernel applies: the same bits) into a
// pinned bf16 staging buffer, and the upload copies those 2 bytes per element into the device
// copy. Such a span takes 4 (gradient staging) + 2 (bf16 staging) host bytes per element beyond
// its master and moments, and no parameter staging.
//
// Early downloads: a group marked early (set_early: its gradients change no more after the
// executor reports them final — no data-parallel reduction, no tied-gradient sum follows — or,
// with data parallelism, once its all-reduce or reduce-scatter has landed) is downloaded by
// grads_final(g), called when the gradients are final on the compute stream (or on the stream
// the caller names): the d2h stream waits for that point and copies p and the unclipped g while
// the backward of the other chunks goes on. Without speculation its CPU update still waits for
// step(): the global gradient norm (clipping) and the non-finite guard need every gradient of
// every rank first; the update then scales the host copy by the clip coefficient (the device
// kernel's x *= coef, one f32 multiply: the same bits).
//
// Speculation (set_speculative; memory.optimizer_overlap): the update of every element depends on
// the clip coefficient, a norm over every gradient of every rank, and a skipped step (non-finite
// norm or loss) must leave the state untouched; neither is known before the last backward. So an
// early group does not wait for them: right after its download the cpu stream runs the whole
// AdamW update assuming coefficient 1 and no skip, with the step's lr and step number (given to
// begin_step), writing the new moments (and a host master's new f32 value) into shadow buffers
// and the new parameters into the staging; the live state stays intact. step() then commits or
// discards each speculation:
//   * commit when the coefficient is exactly 1.0f (clipping off, or the norm below the maximum:
//     min(1, max/(norm+1e-6)) is then 1.0f, and g * 1.0f == g bitwise) and the lr and step are the
//     ones speculated with: the upload waits for the speculative update, then the cpu stream
//     copies the shadows over the live moments and masters;
//   * discard otherwise: the group is downloaded again (after the speculation, which read the
//     staging) with the device's clipped gradients, and updated from the intact state as without
//     speculation.
// Both branches leave exactly the bits of the update without speculation: a committed speculation
// computed the same formula on the same values. A skipped step never calls step(): begin_step
// drops its speculations (the shadows are simply overwritten by the next one). Shadows: 8 bytes
// per element (m, v), 4 more per host-master element (the master); the parameter staging of a
// device master is the speculation's output already. Allocated with the staging, in dry runs too.
//
// One update (step), called on the rank's host thread once the gradients are final and clipped
// (the compute stream's work so far); it only enqueues, on three streams of the device:
//
//   compute ──record──► d2h: for each group g not downloaded early: copy p, g of its spans to
//                       staging (g only for a host-master span); record down[g]
//   cpu:  for each group g in order: wait down[g]; a host task (Stream::enqueue_host): the clip
//         scaling of an early copy, cpu_adamw_update on every span of g (oneTBB), the bf16
//         rounding of its host masters; record updated[g] (a committed speculation: a host task
//         copying the shadows over the live state instead)
//   h2d:  wait updated[g] (committed: the speculation); copy staging p back to the device
//         (host-master span: its bf16 rounding into the device copy); record up[g]
//
// so the CPU update of group g overlaps the D2H of the groups after it and the H2D of the groups
// before it, and step() returns before any of it is done: the host thread goes on enqueueing the
// next step while the CPU arithmetic runs, and the next step's first ops compute while the later
// groups are still updated. The uploads are left in flight: nothing on the compute stream waits
// for them yet. The next step orders its work on them group by group: before the first op of the
// next step that reads group g's parameters, the caller calls params_needed(g), a stream wait of
// compute on up[g] (never a host wait), so compute stalls only where an update or upload is
// actually late. Anything that reads or writes the parameters or the moments outside a step
// (checkpoints, evaluation, loads) calls settle() first, a host wait for every update and upload.
// A dry run (dry = true) enqueues the copies (nothing is copied on a dry device) and skips the
// CPU arithmetic: the host pages of a dry device are address ranges only.
//
// Bitwise: cpu_adamw_update is the device kernel's arithmetic (the CPU backend's adamw_step),
// and the copies move bits, so an offloaded update leaves exactly the parameters and moments the
// device update would.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/error.h"
#include "core/device.h"
#include "core/kernels/optim_kernels.h"
#include "core/tensor.h"

namespace stp {

class HostUpdate {
 public:
  // groups: the number of span groups (a rank's local chunks).
  HostUpdate(Device& device, Stream& compute, std::size_t groups, bool dry);
  ~HostUpdate();  // waits for the updates and uploads in flight (they use the staging and moments)
  HostUpdate(const HostUpdate&) = delete;
  HostUpdate& operator=(const HostUpdate&) = delete;

  // Pinned host memory for the moments and the host masters (counted in host_bytes()).
  Allocator& allocator() { return host_; }
  // Host state bytes an offloaded element with its master on the device takes: moments + staging
  // (a host master's element takes 18: master, moments, gradient and bf16 staging).
  static std::size_t bytes_per_element() { return 4 * sizeof(float); }

  // A span of n elements: param and grad on the device, m and v in allocator()'s memory; with
  // `compute` (a host master): param in allocator()'s memory, compute its bf16 copy on the device.
  // Call every add before the first step (staging is allocated then).
  void add(std::size_t group, float* param, const float* grad, float* m, float* v, std::size_t n, bool decay,
           bf16* compute = nullptr);

  void set_early(std::size_t group, bool early) { groups_.at(group).early = early; }
  // A direct group (parameter streaming, offload/param_streamer.h): its spans' parameters,
  // gradients and bf16 copies already live in pinned host memory. The CPU update reads the
  // gradients and updates the masters in place, and a host master's bf16 rounding goes straight
  // into its (host) copy: no staging is allocated and no copy is enqueued for the group. Its
  // "download" and "upload" are the events alone (down: the gradients are final and clipped; up:
  // the update is done), so grads_final, params_needed and settle order it as any other group.
  // Call before the first step.
  void set_direct(std::size_t group, bool direct) {
    STP_ASSERT(!staged_, "HostUpdate: a direct group set after the first step");
    groups_.at(group).direct = direct;
  }
  // Early groups speculate (see the header comment); call before the first step.
  void set_speculative(bool on) {
    STP_ASSERT(!staged_, "HostUpdate: speculation set after the first step");
    speculative_ = on;
  }
  bool speculative(std::size_t group) const { return speculative_ && groups_.at(group).early; }
  // Forgets the previous step's early downloads and speculations; call at the start of every step
  // with the lr, hyperparameters and step number the step's update will use (step() receives them
  // again: a speculation made with others is discarded).
  void begin_step(float lr, const AdamWHyper& hyper, int step);
  // The group's gradients are final at this point of `after` (default: the compute stream); no-op
  // unless early. An early group of a speculative update starts its speculative update here.
  void grads_final(std::size_t group, Stream* after = nullptr);

  // Orders `s` after this step's early downloads: whatever `s` enqueues next may overwrite the
  // gradients and parameters they read (the clip scaling writes the gradients in place).
  void order_after_downloads(Stream& s);

  // This step's clip coefficient (host value of the device's; begin_step resets it to 1), applied
  // to the early copies, which hold the gradients before clipping.
  void set_clip_coefficient(float coef) { coef_ = coef; }

  // One update of every span (see the header comment); the uploads are left in flight (pending)
  // until params_needed or settle. Not called on a skipped step (begin_step drops its downloads).
  void step(float lr, const AdamWHyper& hyper, int step);
  Event& uploaded(std::size_t group) { return *groups_.at(group).up; }
  // Whether group's last upload has not been waited for by compute (params_needed) or the host.
  bool pending(std::size_t group) const { return groups_.at(group).pending; }
  // The compute stream is ordered after group's last upload (a stream wait; no-op when none is
  // pending). Call before the first compute work of a step that reads the group's parameters.
  void params_needed(std::size_t group);
  // Host wait for every update and upload in flight (outside a step: checkpoints, evaluation,
  // loads).
  void settle();

  std::size_t host_bytes() const { return host_bytes_; }      // moments + masters + staging, allocated so far
  std::size_t shadow_bytes() const { return shadow_bytes_; }  // of those: the speculation's shadows
  // Bytes enqueued so far on the d2h and h2d streams (downloads and uploads; none for a direct group).
  std::uint64_t copied_bytes() const { return copied_bytes_; }

  // The last step()'s speculations: committed and discarded groups. hidden_ns: the CPU time of
  // every committed speculative update so far (the update time taken off the step's tail; each is
  // counted once its commit has run on the cpu stream: read it after settle for an exact total).
  struct Speculation {
    std::size_t committed = 0, discarded = 0;
  };
  Speculation last_speculation() const { return last_; }
  std::int64_t hidden_ns() const { return hidden_ns_.load(); }
  Stream& compute() { return compute_; }
  Stream& d2h() { return *d2h_; }
  Stream& h2d() { return *h2d_; }
  Stream& cpu() { return *cpu_; }  // runs the CPU updates (host tasks)

 private:
  struct Span {
    float* param;
    const float* grad;
    float *m, *v;
    bf16* compute;      // the device bf16 copy of a host master, or nullptr
    std::size_t n, at;  // elements; offset in the group's gradient staging
    std::size_t p_at;   // offset in the parameter staging (device master) or bf16 staging (host master)
    bool decay;
  };
  struct Group {
    std::vector<Span> spans;
    std::size_t elements = 0, device_masters = 0, host_masters = 0;  // elements in all, by master
    Tensor p_host, g_host, c_host;  // staging (device_masters,) f32, (elements,) f32, (host_masters,) bf16
    // speculation: (elements,) f32 each, (host_masters,) f32; a direct group's p_shadow holds
    // every span's new master, (elements,) f32
    Tensor m_shadow, v_shadow, p_shadow;
    std::unique_ptr<Event> final, down, updated, up, spec;
    Event* reads = nullptr;  // the last work reading the gradients (order_after_downloads waits for it)
    bool early = false, downloaded = false, direct = false;
    bool pending = false;      // uploaded; compute not ordered after it yet
    bool speculated = false;   // this step's speculative update is enqueued, not yet committed or dropped
    bool spec_events = false;  // spec has been recorded (a download waits for it: it reads the staging)
    std::int64_t spec_ns = 0;  // the last speculative update's CPU time (written by its task)
  };
  void download(Group& g, Stream& after);
  void speculate(std::size_t group);
  void enqueue_update(std::size_t group, bool rescale, float coef, float lr, const AdamWHyper& hyper, int step);
  void enqueue_commit(std::size_t group);
  class CountingAllocator final : public Allocator {
   public:
    CountingAllocator(Device& device, std::size_t& counter) : inner_(device, true), counter_(counter) {}
    std::shared_ptr<Storage> allocate(std::size_t bytes) override {
      counter_ += bytes;
      return inner_.allocate(bytes);
    }
    Device& device() override { return inner_.device(); }

   private:
    DeviceAllocator inner_;
    std::size_t& counter_;
  };
  void allocate_staging();

  Stream& compute_;
  std::unique_ptr<Stream> d2h_, h2d_, cpu_;
  std::unique_ptr<Event> ready_;
  std::vector<Group> groups_;
  std::size_t host_bytes_ = 0;
  CountingAllocator host_;
  std::size_t shadow_bytes_ = 0;
  std::uint64_t copied_bytes_ = 0;
  float coef_ = 1.0f;
  // The update begin_step announced (the speculation's arguments).
  float lr_ = 0;
  AdamWHyper hyper_;
  int step_ = 0;
  bool announced_ = false;
  Speculation last_;
  std::atomic<std::int64_t> hidden_ns_{0};
  bool dry_, staged_ = false, speculative_ = false;
};

}  // namespace stp
