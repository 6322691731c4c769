// Optimizer offload (memory.optimizer_offload): the AdamW update of one rank run by the CPU
// (optim/cpu_adamw.h) on state that lives in pinned host memory, fed and drained by two copy
// streams of the device.
//
// Host memory (pinned, Device::allocate_pinned_host through a DeviceAllocator): the moments
// exp_avg / exp_avg_sq of every span (allocated by the optimizer from allocator()), and per group
// one staging buffer for the parameters (its device-master elements) and one for the gradients
// (group elements). The device keeps only the parameters and gradients: no optimizer byte is
// device memory.
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
// executor reports them final — no data-parallel reduction, no tied-gradient sum follows) is
// downloaded by grads_final(g), called when the executor reports the chunk's last backward: the
// d2h stream waits for that point of the compute stream and copies p and the unclipped g while
// the backward of the other chunks goes on. Its CPU update still waits for step(): the global
// gradient norm (clipping) and the non-finite guard need every gradient of every rank first; the
// update then scales the host copy by the clip coefficient (the device kernel's x *= coef, one f32
// multiply: the same bits).
//
// One update (step), called on the rank's host thread once the gradients are final and clipped
// (the compute stream's work so far); it only enqueues, on three streams of the device:
//
//   compute ──record──► d2h: for each group g not downloaded early: copy p, g of its spans to
//                       staging (g only for a host-master span); record down[g]
//   cpu:  for each group g in order: wait down[g]; a host task (Stream::enqueue_host): the clip
//         scaling of an early copy, cpu_adamw_update on every span of g (oneTBB), the bf16
//         rounding of its host masters; record updated[g]
//   h2d:  wait updated[g]; copy staging p back to the device (host-master span: its bf16 rounding
//         into the device copy); record up[g]
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

#include <cstddef>
#include <memory>
#include <vector>

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
  // Forgets the previous step's early downloads; call at the start of every step.
  void begin_step();
  // The group's gradients are final at this point of the compute stream (no-op unless early).
  void grads_final(std::size_t group);

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

  std::size_t host_bytes() const { return host_bytes_; }  // moments + masters + staging, allocated so far
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
    std::unique_ptr<Event> final, down, updated, up;
    bool early = false, downloaded = false;
    bool pending = false;  // uploaded; compute not ordered after it yet
  };
  void download(Group& g);
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
  float coef_ = 1.0f;
  bool dry_, staged_ = false;
};

}  // namespace stp
