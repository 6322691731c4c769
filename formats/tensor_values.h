// Values a tensor must not hold when stp imports it or calls it a good state: values that are not
// finite (inf, NaN) anywhere, and negative values where the tensor cannot have them (AdamW's
// exp_avg_sq, a running mean of squares). Used by the imports (model.init_from, train.resume,
// `stp generate`; train/hf_convert.h) and by every checkpoint write (train/trainer.h).
#pragma once

#include <string>
#include <vector>

namespace stp {

enum class ValueRule {
  Finite,             // every value finite
  FiniteNonNegative,  // every value finite and >= 0 (-0 is fine)
};

// "" when every value of `data` obeys `rule`; else what breaks it, as a phrase that follows the
// tensor's name: "holds 3 values that are not finite (the first, at index 17, is inf)" or "holds
// 2 negative values (the first, at index 4, is -1)".
std::string value_problem(const std::vector<float>& data, ValueRule rule);

}  // namespace stp
