// A test hook that makes one rank fail in the middle of a training step, so tests can check that
// a failure anywhere ends the whole job quickly with the failing rank's message (in one process
// and under mpirun). Read from the environment once per Trainer:
//
//   STP_FAULT_RANK=G   global rank G throws stp::Error in its step, after its batch is uploaded
//                      and before it walks its op list, while every other rank is mid-step
//                      waiting for it;
//   STP_FAULT_STEP=S   in step S (1-based; default 1);
//   STP_FAULT_KIND=K   what it throws: `error` (default, stp::Error), `device` (stp::DeviceError,
//                      as a CUDA/NCCL failure would: `stp` exits with status 4) or `sticky` (the
//                      same, after poisoning gpu::device_health() as a sticky CUDA error does:
//                      the teardown then runs in the poisoned state, core/gpu_logic.h); or
//                      `nan_grad`: throw nothing, but once rank G's gradients of step S are final
//                      (after the data-parallel and tied-embedding sums, before the norm) set the
//                      first element of the gradient of its first parameter that enters the global
//                      norm there (not the tied wte, not a replicated tensor on a TP rank > 0: copies
//                      every holder computes alike) to NaN, as an overflow would (the non-finite
//                      guard then skips the step).
//
// Unset (the normal case): no effect. Not a feature: documented in docs/scale-out.md as a test hook.
#pragma once

#include <cstdint>

namespace stp {

struct FaultHook {
  int rank = -1;
  std::int64_t step = 1;
  bool device = false;    // STP_FAULT_KIND=device or sticky
  bool sticky = false;    // STP_FAULT_KIND=sticky
  bool nan_grad = false;  // STP_FAULT_KIND=nan_grad

  static FaultHook from_env();  // throws stp::Error on a malformed value
  // Throws the injected failure when (global, step) is the configured one.
  void maybe_fail(int global, std::int64_t current_step) const;
  // nan_grad: whether (global, step) is the one whose gradient gets the NaN.
  bool poisons(int global, std::int64_t current_step) const {
    return nan_grad && global == rank && current_step == step;
  }
};

}  // namespace stp
