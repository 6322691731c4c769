#include "train/model_flops.h"

#include "config/config.h"
#include "models/registry.h"
#include "train/stage_layout.h"

namespace stp {

double model_flops_per_token(const Config& config) { return model_training_flops_per_token(model_spec_of(config)); }

}  // namespace stp
