// The vector instruction sets the CPU kernels choose among at run time, and the one place that
// chooses: every host vector path (AdamW's ranges, the fused attention's tile products, the softmax
// and activation rows) asks cpu_has_isa() before it runs, and nothing else asks the CPU.
//
// STP_CPU_ISA caps the choice (docs/config.md, Environment): `scalar`, `avx2` or `avx512` (unset
// or empty: no cap). With `avx2` an AVX-512 machine runs exactly the kernels an AVX2-only CPU runs,
// so a test suite can check that CPU's arithmetic anywhere (tools/test.sh does). The cap never
// widens: a CPU without AVX2 runs the scalar code whatever the variable says. It is read once, at
// the first call of best_cpu_isa() in the process.
#pragma once

#include <optional>
#include <string>

namespace stp {

// In order of width: each set includes the ones before it.
//   Avx2:   AVX2 and FMA;
//   Avx512: AVX-512F as well.
enum class CpuIsa { Scalar, Avx2, Avx512 };

std::string to_string(CpuIsa isa);  // "scalar", "avx2", "avx512": the names STP_CPU_ISA takes

// The widest set this CPU runs, no wider than STP_CPU_ISA. An STP_CPU_ISA that is not one of the
// names throws stp::Error naming it and the names (every call, until it is fixed).
CpuIsa best_cpu_isa();

// Whether the kernels may use `isa` here: isa is no wider than best_cpu_isa() (Scalar: always).
bool cpu_has_isa(CpuIsa isa);

// The parts of best_cpu_isa(), exposed for tests: the cap a value of STP_CPU_ISA sets (null or
// empty: none; stp::Error for an unknown name), and the widest set the CPU itself runs.
std::optional<CpuIsa> cpu_isa_cap(const char* value);
CpuIsa detected_cpu_isa();

}  // namespace stp
