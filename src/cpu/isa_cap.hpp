#pragma once
// FAVOR_CPU: run favor as a CPU with fewer instructions would (docs/reliability.md, "Other
// CPUs on this one"). The cap limits Highway's run-time dispatch (vec_math.cpp) and turns bf16
// off below AVX-512; the BLAS's kernel is chosen when the BLAS loads, before favor runs, so the
// environment must name it (OPENBLAS_CORETYPE): scripts/as-cpu.sh sets both, and the torch and
// numpy dispatch caps with them. Here favor checks that the BLAS's kernel respects the cap.
#include <cstdint>
#include <string>

namespace favor::cpu {

struct IsaCap {
  std::string name;          // "" (no cap), "avx512", "avx2", "sse4" or "scalar"
  int64_t hwy_disabled = 0;  // Highway targets (HWY_* bits) above the cap
  bool bf16_off = false;     // AVX512-BF16 is beyond the cap
  std::string error;         // a bad FAVOR_CPU: the message favor::Error carries
};

/// A FAVOR_CPU value (nullptr or "" or "native": no cap; a bad value: `error` set).
IsaCap parse_isa_cap(const char* text);

/// FAVOR_CPU as read when libfavor loaded (its Highway cap is applied then).
const IsaCap& isa_cap();

/// The SIMD target Highway dispatches favor's kernels to (its name: "AVX3", "AVX2", ...), as
/// chosen when libfavor loaded, within the cap.
const std::string& simd_target();

/// Throws favor::Error when FAVOR_CPU is not one of the caps.
void check_isa_cap();

/// The instruction level of an OpenBLAS core name (openblas_get_corename): 4 AVX-512, 3 AVX2,
/// 2 AVX, 1 SSE4 or less; 0 for a name not in the table (assumed within any cap). And a cap's
/// level (4 for no cap).
int openblas_core_level(const std::string& core);
int cap_level(const IsaCap& cap);

/// "" when the linked BLAS's kernel is within the cap, else why not (and how to fix it).
std::string blas_cap_mismatch();

/// The OpenBLAS core name in use ("SkylakeX", "Haswell", ...).
std::string blas_core();

}  // namespace favor::cpu
