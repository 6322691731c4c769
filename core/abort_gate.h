// AbortGate: serialises a communicator's abort against the operations other threads are issuing
// on it (docs/gpu-readiness.md, How a CUDA failure reaches the user). Backend-independent, so the CPU tests prove it;
// NcclComm (core/cuda/nccl_comm.cu) uses it because ncclCommAbort frees the communicator, and an enqueue another rank's
// thread is making at that moment would touch freed memory.
//
//   enter()/leave()  bracket every use of the communicator's handle (an NCCL call, or an
//                    operation queued in an open NCCL group until that group's end). enter()
//                    throws CommunicatorAborted once an abort was requested, so no new use starts.
//   abort(why)       requests the abort once (later calls return false). The abort action (e.g.
//                    ncclCommAbort) runs exactly once: at once if nobody is inside, otherwise in
//                    the leave() of the last thread inside — never while a use is in progress.
//
// Thread-safe. The action runs without the gate's lock held (it may block, as ncclCommAbort does).
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "core/comm.h"
#include "base/error.h"

namespace stp {

class AbortGate {
 public:
  explicit AbortGate(std::function<void()> action) : action_(std::move(action)) {}

  void enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (requested_) throw CommunicatorAborted(str("communicator aborted: ", why_));
    ++inside_;
  }
  // Like enter(), but false instead of throwing (for pollers that must not start a use late).
  bool try_enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (requested_) return false;
    ++inside_;
    return true;
  }
  void leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      STP_ASSERT(inside_ > 0, "AbortGate::leave without enter");
      if (--inside_ > 0 || !requested_ || done_) return;
      done_ = true;
    }
    action_();
  }
  bool abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (requested_) return false;
      requested_ = true;
      why_ = why;
      if (inside_ > 0) return true;  // the last leave() runs the action
      done_ = true;
    }
    action_();
    return true;
  }
  bool requested() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requested_;
  }
  bool done() const {  // the action has run (or is running)
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::string why() const {
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }

 private:
  std::function<void()> action_;
  mutable std::mutex mu_;
  int inside_ = 0;
  bool requested_ = false, done_ = false;
  std::string why_;
};

// RAII enter/leave.
class GateUse {
 public:
  explicit GateUse(AbortGate& g) : g_(&g) { g.enter(); }
  ~GateUse() {
    if (g_) g_->leave();
  }
  GateUse(const GateUse&) = delete;
  GateUse& operator=(const GateUse&) = delete;
  void release() { g_ = nullptr; }  // the use continues (e.g. queued in an open group): leave() later

 private:
  AbortGate* g_;
};

}  // namespace stp
