// Where the model's layers land: the GPT-2 shape of a config and the stage spec of one
// (pipeline rank, local chunk, TP rank). Shared by the trainer and the memory planner, which must
// build exactly the same stages.
#pragma once

#include "config/config.h"
#include "models/gpt2_config.h"
#include "schedule/schedule.h"

namespace stp {

GPT2Config gpt2_config_of(const Config& config);

// Layers of stage schedule.stage(pp_rank, chunk), split evenly over the schedule's stages.
GPT2StageSpec stage_spec_of(const Config& config, const sched::Schedule& schedule, int pp_rank, int chunk, int tp_rank);

}  // namespace stp
