#include "cpu/isa_cap.hpp"

#include <favor_openblas.h>  // the linked OpenBLAS (cmake/FindFavorBLAS.cmake)

#include <hwy/targets.h>
#include <cstdlib>

#include "favor/error.hpp"

namespace favor::cpu {
namespace {

// Read and applied when libfavor loads, before any kernel dispatches. Highway 1.0's
// SupportedTargets() points the dispatch at every target the CPU has, ignoring DisableTargets,
// until its caller updates it again: favor asks it here only, once, and updates right after
// (a later call, even to print the target, would undo the cap for every call after it).
struct Dispatch {
  IsaCap cap;
  std::string simd;
};
const Dispatch g_dispatch = [] {
  Dispatch d{parse_isa_cap(std::getenv("FAVOR_CPU")), ""};
  if (d.cap.hwy_disabled != 0) hwy::DisableTargets(d.cap.hwy_disabled);
  const int64_t targets = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(targets);
  const int64_t generated = targets & HWY_TARGETS;
  d.simd = generated == 0 ? "unknown" : hwy::TargetName(generated & -generated);
  return d;
}();
const IsaCap& g_cap = g_dispatch.cap;

}  // namespace

// Highway marks better targets with lower bits: a cap disables every bit below its own.
IsaCap parse_isa_cap(const char* text) {
  IsaCap cap;
  const std::string v = text == nullptr ? "" : text;
  if (v.empty() || v == "native") return cap;
  cap.name = v;
  if (v == "avx512") {
    cap.hwy_disabled = HWY_AVX3 - 1;
  } else if (v == "avx2") {
    cap.hwy_disabled = HWY_AVX2 - 1;
  } else if (v == "sse4") {
    cap.hwy_disabled = HWY_SSE4 - 1;
  } else if (v == "scalar") {
    cap.hwy_disabled = ~(HWY_EMU128 | HWY_SCALAR);
  } else {
    cap.name.clear();
    cap.error = "FAVOR_CPU: '" + v + "' must be native, avx512, avx2, sse4 or scalar";
    return cap;
  }
  cap.bf16_off = v != "avx512";
  return cap;
}

const IsaCap& isa_cap() {
  return g_cap;
}

const std::string& simd_target() {
  return g_dispatch.simd;
}

void check_isa_cap() {
  if (!g_cap.error.empty()) throw Error(g_cap.error);
}

int openblas_core_level(const std::string& core) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return 4;
  for (const char* c : {"Haswell", "Zen", "Excavator"})
    if (core == c) return 3;
  for (const char* c : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"})
    if (core == c) return 2;
  for (const char* c :
       {"Nehalem", "Core2", "Penryn", "Dunnington", "Prescott", "Atom", "Barcelona", "Bobcat",
        "Opteron", "Opteron_SSE3", "Katmai", "Coppermine", "Northwood", "Banias"})
    if (core == c) return 1;
  return 0;
}

int cap_level(const IsaCap& cap) {
  if (cap.name == "avx2") return 3;
  if (cap.name == "sse4" || cap.name == "scalar") return 1;
  return 4;
}

std::string blas_core() {
  return FAVOR_OPENBLAS(openblas_get_corename)();
}

std::string blas_cap_mismatch() {
  const std::string core = blas_core();
  if (openblas_core_level(core) <= cap_level(g_cap)) return "";
  return "the BLAS runs its " + core + " kernel, beyond FAVOR_CPU=" + g_cap.name +
         " (OPENBLAS_CORETYPE must be set before the process starts: scripts/as-cpu.sh does)";
}

}  // namespace favor::cpu
