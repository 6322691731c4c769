#include "core/kernels/cpu_isa.h"

#include <cstdlib>

#include "base/error.h"

namespace stp {

std::string to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Scalar: break;
  }
  return "scalar";
}

std::optional<CpuIsa> cpu_isa_cap(const char* value) {
  if (value == nullptr || *value == '\0') return std::nullopt;
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (to_string(isa) == value) return isa;
  throw Error(str("STP_CPU_ISA='", value,
                  "' is not an instruction set stp knows: use scalar, avx2 or avx512, or unset it (no cap)"));
}

CpuIsa detected_cpu_isa() {
#if defined(__x86_64__) || defined(__i386__)
  // The vector paths are compiled for AVX2 together with FMA (target("avx2,fma")), the AVX-512 ones
  // for AVX-512F with FMA: a set counts only with FMA.
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return CpuIsa::Scalar;
  return __builtin_cpu_supports("avx512f") ? CpuIsa::Avx512 : CpuIsa::Avx2;
#else
  return CpuIsa::Scalar;
#endif
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = [] {
    const CpuIsa cpu = detected_cpu_isa();
    const std::optional<CpuIsa> cap = cpu_isa_cap(std::getenv("STP_CPU_ISA"));
    return cap && *cap < cpu ? *cap : cpu;
  }();
  return best;
}

bool cpu_has_isa(CpuIsa isa) { return isa <= best_cpu_isa(); }

}  // namespace stp
