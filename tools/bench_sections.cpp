// favor bench's section table (tools/bench_sections.hpp).
#include "bench_sections.hpp"

#include <algorithm>

namespace favor::cli {

// One function per section; the file that defines it on its right.
void section_sweep(BenchRunner& bench);        // bench_forward.cpp
void section_long(BenchRunner& bench);         // bench_forward.cpp
void section_scaling(BenchRunner& bench);      // bench_forward.cpp
void section_backward(BenchRunner& bench);     // bench_backward.cpp
void section_estimators(BenchRunner& bench);   // bench_estimators.cpp
void section_maps(BenchRunner& bench);         // bench_maps.cpp
void section_vq(BenchRunner& bench);           // bench_vq.cpp
void section_distributed(BenchRunner& bench);  // bench_process_sections.cpp
void section_io(BenchRunner& bench);           // bench_process_sections.cpp
void section_decode(BenchRunner& bench);       // bench_decode.cpp
void section_calls(BenchRunner& bench);        // bench_calls.cpp
void section_bf16(BenchRunner& bench);         // bench_bf16.cpp
void section_load(BenchRunner& bench);         // bench_load.cpp
void section_hybrid(BenchRunner& bench);       // bench_hybrid.cpp

const std::vector<BenchSection>& bench_sections() {
  static const std::vector<BenchSection> table{
      {"sweep", section_sweep, "N x causal, favor and exact"},
      {"long", section_long, "B*H = 1 at the longest N"},
      {"scaling", section_scaling, "1 thread vs all"},
      {"backward", section_backward, "favor and exact backward at --backward-lengths"},
      {"estimators", section_estimators, "each --estimators kernel vs positive"},
      {"maps", section_maps, "feature weights, learned and Hedgehog maps, decay vs FAVOR+"},
      {"vq", section_vq, "Transformer-VQ vs FAVOR+ and exact, forward and backward"},
      {"distributed", section_distributed,
       "sequence-parallel attention over mpirun's ranks: strong and weak scaling"},
      {"io", section_io,
       "favor attention as a whole process on .npy files vs the same call in process"},
      {"decode", section_decode,
       "decoder steps at --decode-positions, batched steps (--decode-batch), prefill "
       "(--decode-prompt)"},
      {"calls", section_calls,
       "one forward call at --call-lengths (short N): favor and exact, and the per-call "
       "overhead"},
      {"bf16", section_bf16, "bidirectional forward, fp32 vs bf16 GEMMs, at --bf16-lengths"},
      {"load", section_load,
       "a decode step, a tiny call and N = 1024 calls on 1 thread and all, idle and with "
       "another process busy on a core (at the same priority, and at nice -10)"},
      {"hybrid", section_hybrid,
       "causal hybrid attention (window 64, sinks 4) vs plain FAVOR and exact at --lengths "
       "up to 8192, and both backwards at N = 2048 (or the longest below)"},
  };
  return table;
}

std::string bench_sections_help(const std::vector<std::string>& defaults) {
  std::string text = "which rows, run in this order: ";
  std::vector<std::string> others;
  for (const BenchSection& s : bench_sections()) {
    if (&s != &bench_sections().front()) text += ", ";
    text += std::string(s.name) + " (" + s.description + ")";
    if (std::find(defaults.begin(), defaults.end(), s.name) == defaults.end())
      others.push_back(s.name);
  }
  if (others.empty()) return text + "; all run by default";
  text += "; ";
  for (size_t i = 0; i < others.size(); ++i)
    text += (i == 0 ? "" : i + 1 == others.size() ? " and " : ", ") + others[i];
  return text + (others.size() == 1 ? " is" : " are") + " not in the default run";
}

}  // namespace favor::cli
