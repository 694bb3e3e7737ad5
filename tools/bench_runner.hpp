#pragma once
// favor bench's machinery shared by its sections (tools/bench_sections.hpp): the arguments,
// timing with memory figures, the rows the sections are made of (FAVOR and exact attention,
// forward and backward) and the records, printed as a table row by row unless --json.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "alloc_tracker.hpp"
#include "cost_model.hpp"
#include "favor/favor.hpp"
#include "workload.hpp"

namespace favor::cli {

struct BenchArgs {
  bool json = false;
  std::string out, plot, kernel = "positive";
  std::vector<int64_t> lengths{256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
  int64_t bh = 8, d = 64, m = 256, max_exact_n = 32768, scaling_n = 16384, sgemm_n = 4096;
  std::vector<int64_t> decode_positions{1024, 65536};
  std::vector<int64_t> decode_batch{1, 32};  // sequences B of the batched decode rows
  int64_t decode_prompt = 1024;              // prompt of the prefill rows (0: none)
  std::vector<std::string> sections{"sweep", "long", "scaling", "decode", "backward", "estimators"};
  std::vector<std::string> estimators{"positive", "trig", "hyperbolic", "favorpp", "favorsharp"};
  std::vector<int64_t> estimator_lengths{4096, 16384};
  std::vector<int64_t> bf16_lengths{4096, 16384};
  std::vector<int64_t> backward_lengths{1024, 4096, 16384, 65536};
  int64_t max_exact_backward_n = 4096;
  std::vector<int64_t> vq_lengths{512, 1024, 2048, 4096, 8192, 16384};
  int64_t vq_codes = 256, vq_block = 32;  // favor's default L (cpu::kVQBlock)
  int repeats = 5;
  double min_time = 0.3;
  int64_t distributed_n = 262144, distributed_weak_n = 262144;
  std::vector<int> distributed_ranks{1, 2, 4};
  int64_t io_n = 16384;
  bool sgemm_peers = true;  // time numpy's and torch's sgemm too (tools/sgemm_peers.py)
  std::vector<int64_t> call_lengths{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  bool has(const std::string& section) const {
    return std::find(sections.begin(), sections.end(), section) != sections.end();
  }
};

/// Resident-set figures of this process, in MiB, from /proc/self/status.
double status_mib(const char* field);

struct Measured {
  double seconds, heap_mb, rss_mb;
};

/// The fields every timed row has: what ran, its time, rate (cost-model flops) and memory.
nlohmann::json timed_record(const char* method, bool causal, int64_t n, int64_t bh, int threads,
                            const Measured& t, double flops);

/// Times f (median) and measures its memory beyond what is live before it: the peak of heap
/// bytes it allocates (all favor allocations go through operator new) and the growth of the
/// resident high-water mark (reset through /proc/self/clear_refs; BLAS buffers included).
template <class F>
Measured measure(F&& f, int repeats, double min_time) {
  f();  // warm-up: BLAS buffers, page faults of the output
  reset_heap_peak();
  const double rss_before = status_mib("VmRSS:");
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const double s = median_seconds(f, repeats, 1.0, min_time);
  return {s, double(heap_peak_growth()) / (1024.0 * 1024.0),
          std::max(0.0, status_mib("VmHWM:") - rss_before)};
}

class BenchRunner {
 public:
  explicit BenchRunner(const BenchArgs& a);

  /// The header and the sgemm yardstick, then each section of --sections in the order of
  /// the registry (bench_sections()).
  void run();

  const BenchArgs& args() const { return a_; }
  /// --kernel: the kernel of every row that does not name its own.
  Kernel kernel() const { return kernel_; }
  const nlohmann::json& records() const { return records_; }
  /// The records so far, for sections that annotate rows already emitted.
  nlohmann::json& records() { return records_; }
  /// Fields added to every record emitted while set (null: none).
  void set_tag(nlohmann::json tag) { tag_ = std::move(tag); }

  /// Completes a record (section, d, m, kernel, pass, percent_of_sgemm against favor's BLAS,
  /// percent_of_best_sgemm against the best BLAS of the run), prints its table row unless
  /// --json and keeps it.
  void emit(nlohmann::json r);

  /// One FAVOR forward row; returns its seconds. kernel: the --kernel one unless given.
  double favor_row(int64_t bh, int64_t n, bool causal, int threads,
                   std::optional<Kernel> kernel = {}, nlohmann::json extra = {});
  double exact_row(int64_t bh, int64_t n, bool causal);
  /// FAVOR backward (and, bidirectional with_context, the saved-context training pattern);
  /// returns the seconds of the plain backward.
  double favor_backward_row(int64_t bh, int64_t n, bool causal, double forward_seconds,
                            bool with_context = true);
  double exact_backward_row(int64_t bh, int64_t n, bool causal, double forward_seconds);

  bench::Problem problem(int64_t bh, int64_t n, std::optional<Kernel> kernel = {}) const;
  /// q, k (rows of norm D^(1/4)) and v [1, bh, n, D], seeded.
  std::tuple<Tensor, Tensor, Tensor> inputs(int64_t bh, int64_t n, uint64_t seed = 0) const;

 private:
  void header();
  void sgemm();
  void backward_record(const char* method, int64_t bh, int64_t n, bool causal, const Measured& t,
                       double flops, double forward_seconds, bool context);

  BenchArgs a_;
  Kernel kernel_;
  nlohmann::json tag_;
  std::string section_ = "yardstick";
  double sgemm_gflops_ = 0.0;       // favor's BLAS
  double best_sgemm_gflops_ = 0.0;  // the best of favor's, numpy's and torch's
  nlohmann::json records_ = nlohmann::json::array();
};

}  // namespace favor::cli
