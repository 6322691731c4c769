// core/kernels/cpu_isa.h: the one run-time choice of vector instruction set and its cap,
// STP_CPU_ISA. tools/test.sh runs this suite a second time with STP_CPU_ISA=avx2, where the last
// test checks that the cap is in force.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "core/kernels/cpu_isa.h"

using namespace stp;

TEST(CpuIsa, CapNamesAreTheIsaNames) {
  EXPECT_EQ(cpu_isa_cap(nullptr), std::nullopt);
  EXPECT_EQ(cpu_isa_cap(""), std::nullopt);
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    EXPECT_EQ(cpu_isa_cap(to_string(isa).c_str()), isa) << to_string(isa);
  EXPECT_EQ(to_string(CpuIsa::Scalar), "scalar");
  EXPECT_EQ(to_string(CpuIsa::Avx2), "avx2");
  EXPECT_EQ(to_string(CpuIsa::Avx512), "avx512");
}

TEST(CpuIsa, UnknownCapIsAnErrorNamingItAndTheChoices) {
  for (const char* bad : {"AVX2", "avx", "sse4", "avx512f", " avx2"}) {
    try {
      cpu_isa_cap(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("STP_CPU_ISA='") + bad + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("scalar, avx2 or avx512"), std::string::npos) << m;
    }
  }
}

// The widest allowed set is the CPU's, capped by the variable of this process; the narrower sets
// are allowed with it, the wider ones not.
TEST(CpuIsa, BestIsTheCpusCappedByStpCpuIsa) {
  const CpuIsa cpu = detected_cpu_isa();
  const std::optional<CpuIsa> cap = cpu_isa_cap(std::getenv("STP_CPU_ISA"));
  const CpuIsa want = cap && *cap < cpu ? *cap : cpu;
  EXPECT_EQ(best_cpu_isa(), want) << "cpu " << to_string(cpu) << ", STP_CPU_ISA "
                                  << (cap ? to_string(*cap) : std::string("unset"));
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    EXPECT_EQ(cpu_has_isa(isa), isa <= want) << to_string(isa);
  EXPECT_TRUE(cpu_has_isa(CpuIsa::Scalar));
}
