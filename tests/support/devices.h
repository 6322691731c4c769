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

// Whether `count` devices of `kind` are usable here; when not, `why` says what was found.
inline bool usable(DeviceKind kind, int count, std::string* why = nullptr) {
  std::string reason;
  if (kind == DeviceKind::Cuda && !cuda_usable(count, &reason)) {
    if (why) *why = reason;
    return false;
  }
  return true;
}

// Devices of `kind`, or empty when the kind is unavailable here (`why` then says what was found).
inline std::vector<std::unique_ptr<Device>> devices_or_skip(DeviceKind kind, int count = 1,
                                                            std::string* why = nullptr) {
  if (!usable(kind, count, why)) return {};
  BackendOptions o;
  o.kind = kind;
  o.count = count;
  return make_devices(o);
}

}  // namespace stp::testing

// The skip message carries cuda_usable's reason ("1 GPU(s) visible, 2 needed (one per rank)", "no
// NVIDIA driver was found ..."): tools/gpu-check reads it to tell a legitimate skip (more GPUs
// needed than the machine has) from a CUDA case that should have run.
#define STP_DEVICES_OR_SKIP(var, kind, count)                          \
  std::string var##_why;                                               \
  auto var = ::stp::testing::devices_or_skip(kind, count, &var##_why); \
  if (var.empty()) GTEST_SKIP() << "no usable " << ::stp::to_string(kind) << " device here: " << var##_why

// The same skip without creating devices, for tests that build their own (a Trainer on
// parallel.backend: cuda): `count` devices of `kind` or GTEST_SKIP with the same message.
#define STP_SKIP_UNLESS_USABLE(kind, count)                                                          \
  do {                                                                                               \
    std::string stp_usable_why_;                                                                     \
    if (!::stp::testing::usable(kind, count, &stp_usable_why_))                                      \
      GTEST_SKIP() << "no usable " << ::stp::to_string(kind) << " device here: " << stp_usable_why_; \
  } while (0)
