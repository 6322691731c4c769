// Test helper: the device kinds a backend-generic test runs on. The CPU backend always; CUDA
// when this build has it and a GPU is usable (otherwise the CUDA instance is GTEST_SKIP-ped,
// so it is reported as skipped, never as passed).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace stp::testing {

inline std::vector<DeviceKind> all_kinds() { return {DeviceKind::Cpu, DeviceKind::Cuda}; }

inline std::string kind_name(const ::testing::TestParamInfo<DeviceKind>& info) { return to_string(info.param); }

// Devices of `kind`, or empty when the kind is unavailable here (`why` then says what was found).
inline std::vector<std::unique_ptr<Device>> devices_or_skip(DeviceKind kind, int count = 1, std::string* why = nullptr) {
  if (kind == DeviceKind::Cuda) {
    std::string reason;
    if (!cuda_usable(count, &reason)) {
      if (why) *why = reason;
      return {};
    }
  }
  BackendOptions o;
  o.kind = kind;
  o.count = count;
  return make_devices(o);
}

}  // namespace stp::testing

// The skip message carries cuda_usable's reason ("1 GPU(s) visible, 2 needed (one per rank)", "no
// NVIDIA driver was found ..."): tools/gpu-check reads it to tell a legitimate skip (more GPUs
// needed than the machine has) from a CUDA case that should have run.
#define STP_DEVICES_OR_SKIP(var, kind, count)                                                 \
  std::string var##_why;                                                                      \
  auto var = ::stp::testing::devices_or_skip(kind, count, &var##_why);                        \
  if (var.empty()) GTEST_SKIP() << "no usable " << ::stp::to_string(kind) << " device here: " << var##_why
