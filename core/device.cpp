#include "core/device.h"

namespace stp {

const char* to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::Cuda: return "cuda";
  }
  return "?";
}

}  // namespace stp
