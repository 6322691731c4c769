#include "core/device.h"

#include <cctype>
#include <fstream>

namespace stp {

int pci_numa_node(const std::string& pci_bus_id, const std::string& sysfs) {
  std::string id = pci_bus_id;
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (id.empty() || id.find('/') != std::string::npos) return -1;
  std::ifstream f(sysfs + "/" + id + "/numa_node");
  int node = -1;
  if (!(f >> node) || node < 0) return -1;
  return node;
}

std::size_t gemm_workspace_bytes(DeviceKind kind) { return kind == DeviceKind::Cuda ? std::size_t{32} << 20 : 0; }

std::size_t attention_workspace_bytes(DeviceKind kind) { return kind == DeviceKind::Cuda ? std::size_t{512} << 20 : 0; }

const char* to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::Cuda: return "cuda";
  }
  return "?";
}

}  // namespace stp
