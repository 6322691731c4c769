// The host memory a training run needs, besides what its plan puts on the devices: what `stp plan`
// prints as "host memory" and what check_plan (train/memory_planning.h) holds against
// memory.host_budget and against what the machine has (docs/memory.md, Host memory).
//
//   * Pinned: the sum over the plan's devices of what the plan says is pinned (RankPrediction:
//     the activation pool plus the host-placed model states, host_states). Generic on purpose: a
//     lever that pins more reports it in those fields and is counted here unchanged.
//   * Pageable: the process's buffers that scale with the model, outside the plan, in f32 (P = the
//     elements of every distinct parameter, full shapes). They never coexist, so the peak is the
//     largest that the config can reach:
//       - the checkpoint save (process 0, train/trainer_checkpoint.cpp), streamed tensor by tensor
//         into the files: one parameter's (or moment's) full tensor F with one of its shards S while
//         it is assembled, then with one of its Hugging Face tensors H while that is cut out and
//         written: max over the distinct parameters of 4 (F + max(largest S, largest H)) bytes (8F
//         for the largest tensor at tp 1). Every run saves at its end.
//       - model.init_from and train.resume (train/trainer_load.cpp), streamed tensor by tensor
//         out of the files (formats/tensor_source.h): one parameter's (or moment's) full tensor F
//         with one of its Hugging Face tensors H while it is made from them, then with one shard S
//         while each local rank that holds it takes its part, one rank after another: the save's
//         bound, max 4 (F + max(S, H)), with every stage's copy of a tied table counted. Exact for a
//         file in HF names (what stp writes); a file in stp's names is read whole per tensor (F,
//         then F + S), at most that. Under an MPI launcher a process that holds no shard of the
//         largest tensor peaks lower. Freed before step 1.
//     The token and tokenizer files are not counted: they are read through memory maps
//     (data/data.h), clean page cache the kernel drops under pressure instead of failing.
//   * Devices: on the CPU backend the emulated devices' memory is host memory too (the plan's
//     peak of every device); 0 on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/config.h"
#include "memory/plan.h"

namespace stp {

// The pageable peaks of the three phases above, in bytes (0: the config does not reach it).
struct HostPageable {
  std::size_t checkpoint_save = 0;
  std::size_t init_from = 0;
  std::size_t resume = 0;
  std::size_t peak() const;
};

// This process's part: one process drives every device of every replica (the plan lists one
// replica's, so dp times those); under an MPI launcher a process drives one device (at most the
// plan's largest).
struct HostNeeds {
  std::size_t pinned_activations = 0;  // the activation pools (RankPrediction::host_pinned_bytes)
  std::size_t pinned_states = 0;       // the host-placed model states (RankPrediction::host_states)
  HostPageable pageable;               // this process's peak: pageable.peak()
  std::size_t devices = 0;             // CPU backend: the emulated devices' peaks
  std::size_t pinned() const { return pinned_activations + pinned_states; }
  std::size_t total() const;  // pinned() + pageable.peak() + devices
};

// Bytes of pageable host buffers held now and at most, counted where they are allocated and
// freed: what the checkpoint save and the loads measure against HostPageable
// (CheckpointSave::pageable_peak_bytes, Trainer::load_pageable_peak_bytes).
struct PageableMeter {
  std::size_t now = 0, peak = 0;
  void hold(std::size_t bytes) {
    now += bytes;
    peak = now > peak ? now : peak;
  }
  void release(std::size_t bytes) { now -= bytes; }
};

// P: the elements of every distinct parameter of the model, in full shapes.
std::int64_t full_parameter_count(const Config& config);

HostPageable pageable_host_bytes(const Config& config);

HostNeeds host_needs(const MemoryPlan& plan, const Config& config);

}  // namespace stp
