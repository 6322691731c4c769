// Where the model's layers land: the model shape of a config (models/model_spec.h) and the stage spec of one
// (pipeline rank, local chunk, TP rank). Shared by the trainer and the memory planner, which must
// build exactly the same stages.
#pragma once

#include "config/config.h"
#include "models/model_spec.h"
#include "schedule/schedule.h"

namespace stp {

ModelSpec model_spec_of(const Config& config);

// Layers of stage schedule.stage(pp_rank, chunk), split evenly over the schedule's stages.
StageSpec stage_spec_of(const Config& config, const sched::Schedule& schedule, int pp_rank, int chunk, int tp_rank);

// Bytes of the vocabulary tables (the token embedding and the LM head, f32 masters, padding rows
// included) that one TP rank of pipeline rank pp_rank holds over its chunks: V·C (or V_pad·C/tp
// with vocab parallelism) per table per stage holding it.
std::int64_t vocab_param_bytes(const Config& config, const sched::Schedule& schedule, int pp_rank);

}  // namespace stp
