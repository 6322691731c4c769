// Full stp tensors <-> Hugging Face tensors (names and layouts of models/hf_names.h). Both
// directions only move values (column slices, transposes), so to_hf followed by from_hf is the
// identity bit for bit.
//
// from_hf accepts HF names, or (files written before HF export, e.g. llama .safetensors with
// stp's fused qkv_proj / gate_up_proj) stp's names and layouts throughout: a file holding any
// fused stp name is read entirely in stp's convention.
// Tensors of `hf` that no rule names are ignored (HF's attention-mask buffers, a tied
// lm_head.weight).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "formats/tensor_source.h"
#include "formats/tensor_values.h"
#include "models/hf_names.h"
#include "train/host_needs.h"

namespace stp {

// `full` holds every rule's stp tensor with its full shape (an stp::Error names one that is
// missing or misshapen).
std::map<std::string, HostTensor> to_hf(const std::vector<HfTensorRule>& rules,
                                        const std::map<std::string, HostTensor>& full);

// The shape of HF tensor `part` of rule `r` (a column slice of r.shape, transposed where
// part.transpose says).
Shape hf_part_shape(const HfTensorRule& r, const HfPart& part);

// One HF tensor of rule `r`: the values of `part` (one of r.parts) cut from `full`, the stp tensor
// of shape r.shape. to_hf is this for every part of every rule.
HostTensor to_hf_part(const HfTensorRule& r, const HfPart& part, const float* full);

// Errors name `source`, the HF tensor, the expected and the found shape. Every value taken must
// obey `rule` (formats/tensor_values.h: finite; a second moment also >= 0): an import never
// brings in a parameter or a moment that would make the first update non-finite, and the error
// names `source` and the tensor.
std::map<std::string, HostTensor> from_hf(const std::vector<HfTensorRule>& rules,
                                          const std::map<std::string, HostTensor>& hf, const std::string& source,
                                          ValueRule rule = ValueRule::Finite);

// The same, one stp tensor at a time (from_hf is this for every rule in order, with the same
// errors): whether `hf` is in stp's names, then rule `r`'s full tensor, its HF tensors read from
// `hf` one at a time. `meter` counts the full tensor as held (the caller releases it) and each HF
// tensor beside it while it is copied in; in stp's names the tensor read is the full one.
bool stp_named(const std::vector<HfTensorRule>& rules, const TensorSource& hf);
HostTensor from_hf_tensor(const HfTensorRule& r, const TensorSource& hf, bool stp_names, const std::string& source,
                          ValueRule rule, PageableMeter& meter);

}  // namespace stp
