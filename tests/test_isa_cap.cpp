// FAVOR_CPU, the switch that runs favor as an older CPU would (src/cpu/isa_cap.cpp,
// scripts/as-cpu.sh): the caps it accepts, and that a run under it really is capped (SIMD
// target, bf16, the BLAS's kernel), so that a green suite under the switch means what it says.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cstdlib>
#include <iostream>

#include "cpu/bf16_gemm.hpp"
#include "cpu/isa_cap.hpp"
#include "favor/favor.hpp"

namespace favor {
namespace {

TEST(IsaCap, AcceptsTheCapsAndNamesABadValue) {
  EXPECT_TRUE(cpu::parse_isa_cap(nullptr).name.empty());
  EXPECT_TRUE(cpu::parse_isa_cap("").name.empty());
  EXPECT_EQ(cpu::parse_isa_cap("native").hwy_disabled, 0);
  const cpu::IsaCap avx2 = cpu::parse_isa_cap("avx2");
  EXPECT_EQ(avx2.name, "avx2");
  EXPECT_TRUE(avx2.bf16_off);
  EXPECT_EQ(avx2.hwy_disabled & HWY_AVX2, 0);  // AVX2 itself stays
  EXPECT_NE(avx2.hwy_disabled & HWY_AVX3, 0);
  EXPECT_FALSE(cpu::parse_isa_cap("avx512").bf16_off);  // AVX-512 CPUs may have BF16
  EXPECT_NE(cpu::parse_isa_cap("sse4").hwy_disabled & HWY_AVX2, 0);
  EXPECT_EQ(cpu::parse_isa_cap("scalar").hwy_disabled & (HWY_EMU128 | HWY_SCALAR), 0);
  const cpu::IsaCap bad = cpu::parse_isa_cap("avx3");
  EXPECT_TRUE(bad.name.empty());
  EXPECT_NE(bad.error.find("FAVOR_CPU: 'avx3' must be native, avx512, avx2, sse4 or scalar"),
            std::string::npos)
      << bad.error;
}

TEST(IsaCap, OpenBlasCoresHaveTheirInstructionLevel) {
  EXPECT_EQ(cpu::openblas_core_level("SkylakeX"), 4);
  EXPECT_EQ(cpu::openblas_core_level("Haswell"), 3);
  EXPECT_EQ(cpu::openblas_core_level("Zen"), 3);
  EXPECT_EQ(cpu::openblas_core_level("Sandybridge"), 2);
  EXPECT_EQ(cpu::openblas_core_level("Nehalem"), 1);
  EXPECT_EQ(cpu::openblas_core_level("Prescott"), 1);
  EXPECT_EQ(cpu::cap_level(cpu::parse_isa_cap("avx2")), 3);
  EXPECT_EQ(cpu::cap_level(cpu::parse_isa_cap("")), 4);
}

// Under a cap (make test FAVOR_CPU=..., or .ci/run's second pass): Highway dispatches within
// it, bf16 is off below AVX-512, and the BLAS's kernel is within it (OPENBLAS_CORETYPE, which
// only the environment can set). Without a cap: the best target the CPU supports.
TEST(IsaCap, ThisRunIsWithinTheCap) {
  const cpu::IsaCap& cap = cpu::isa_cap();
  std::cout << "[ cpu      ] " << build_info() << "\n";
  if (cap.name.empty()) {
    EXPECT_EQ(build_info().find("cpu cap"), std::string::npos);
    return;
  }
  // The dispatch points at the best target within the cap. (Asking hwy::SupportedTargets()
  // points Highway 1.0's dispatch back at every target the CPU has until it is updated again:
  // src/cpu/isa_cap.cpp; restored here at once.)
  const size_t dispatched = hwy::GetChosenTarget().GetIndex();
  const int64_t within = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(within);
  EXPECT_EQ(within & cap.hwy_disabled, 0);
  hwy::ChosenTarget expected;
  expected.Update(within);
  EXPECT_EQ(dispatched, expected.GetIndex());
  const std::string allowed = cap.name == "avx512" ? "AVX3 AVX2 SSE4 SSSE3 EMU128 SCALAR"
                              : cap.name == "avx2" ? "AVX2 SSE4 SSSE3 EMU128 SCALAR"
                              : cap.name == "sse4" ? "SSE4 SSSE3 EMU128 SCALAR"
                                                   : "EMU128 SCALAR";
  EXPECT_NE((" " + allowed + " ").find(" " + cpu::simd_target() + " "), std::string::npos)
      << cpu::simd_target();
  if (cap.bf16_off) {
    EXPECT_FALSE(cpu::bf16_supported());
    EXPECT_FALSE(bf16_available());
  }
  EXPECT_EQ(cpu::blas_cap_mismatch(), "");
  EXPECT_NE(build_info().find("cpu cap " + cap.name + " (FAVOR_CPU)"), std::string::npos)
      << build_info();
}

}  // namespace
}  // namespace favor
