// favor bench: the command line, its checks and the outputs (table, JSON, --out, --plot). The
// rows come from the sections of tools/bench_sections.hpp, run by tools/bench_runner.hpp.
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_distributed.hpp"
#include "bench_runner.hpp"
#include "bench_sections.hpp"
#include "cli_common.hpp"
#include "commands.hpp"
#include "plot_runner.hpp"

namespace favor::cli {
namespace {

void run(const BenchArgs& a) {
  for (int64_t n : a.lengths) {
    if (n < 1) throw Error("--lengths: " + std::to_string(n) + " must be >= 1");
  }
  if (a.lengths.empty()) throw Error("--lengths: at least one length");
  if (a.bh < 1 || a.d < 1 || a.m < 1 || a.repeats < 1 || a.sgemm_n < 1 || a.scaling_n < 1) {
    throw Error("--bh, --dim, --features, --repeats, --sgemm-n, --scaling-n: must be >= 1");
  }
  if (!(a.min_time >= 0.0)) throw Error("--min-time: must be >= 0");
  for (const std::string& e : a.estimators) parse_kernel(e, "--estimators");
  for (int64_t n : a.estimator_lengths) {
    if (n < 1) throw Error("--estimator-lengths: " + std::to_string(n) + " must be >= 1");
  }
  for (int64_t n : a.bf16_lengths) {
    if (n < 1) throw Error("--bf16-lengths: " + std::to_string(n) + " must be >= 1");
  }
  if (a.vq_lengths.empty()) throw Error("--vq-lengths: at least one length");
  for (int64_t n : a.vq_lengths) {
    if (n < 1) throw Error("--vq-lengths: " + std::to_string(n) + " must be >= 1");
  }
  if (a.vq_block < 1) throw Error("--vq-block: " + std::to_string(a.vq_block) + " must be >= 1");
  const int64_t shortest =
      std::min(*std::min_element(a.vq_lengths.begin(), a.vq_lengths.end()), int64_t{4096});
  if (a.vq_codes < 1 || a.vq_codes > shortest) {
    throw Error("--vq-codes: " + std::to_string(a.vq_codes) + " must be in [1, " +
                std::to_string(shortest) +
                "]: the codes are keys of each head at the shortest --vq-lengths (and 4096)");
  }
  for (int p : a.distributed_ranks) {
    if (p < 1) throw Error("--distributed-ranks: " + std::to_string(p) + " must be >= 1");
  }
  if (a.distributed_n < 1 || a.distributed_weak_n < 1)
    throw Error("--distributed-n, --distributed-weak-n: must be >= 1");
  for (int64_t n : a.call_lengths) {
    if (n < 1) throw Error("--call-lengths: " + std::to_string(n) + " must be >= 1");
  }
  for (int64_t batch : a.decode_batch) {
    if (batch < 1) throw Error("--decode-batch: " + std::to_string(batch) + " must be >= 1");
  }
  if (a.decode_prompt < 0)
    throw Error("--decode-prompt: " + std::to_string(a.decode_prompt) + " must be >= 0");
  for (int64_t pos : a.decode_positions) {
    if (pos < 0) throw Error("--decode-positions: " + std::to_string(pos) + " must be >= 0");
  }
  BenchRunner bench(a);
  bench.run();
  const std::string text = bench.records().dump(2) + "\n";
  if (a.json) fmt::print("{}", text);
  StagedOutputs outputs;
  if (!a.out.empty()) outputs.stage(a.out, text, "--out");
  if (!a.plot.empty()) {
    // The plot is drawn by matplotlib into a staged file, moved into place with --out.
    draw_plot(bench_plot_script(), text, a.plot, outputs);
  }
  outputs.commit();
}

// --quick: every size the user did not give becomes a tiny one and every row runs once; the
// sections and every other choice stay as given, so the command line runs as written, in
// seconds.
template <class Given>
void shrink_for_quick(BenchArgs& a, Given given) {
  auto set = [&](const char* opt, auto& field, auto value) {
    if (!given(opt)) field = value;
  };
  set("--lengths", a.lengths, std::vector<int64_t>{128, 256});
  set("--bh", a.bh, int64_t{2});
  set("--max-exact-n", a.max_exact_n, int64_t{256});
  set("--scaling-n", a.scaling_n, int64_t{256});
  set("--sgemm-n", a.sgemm_n, int64_t{256});
  set("--decode-positions", a.decode_positions, std::vector<int64_t>{64});
  set("--decode-batch", a.decode_batch, std::vector<int64_t>{1, 2});
  set("--decode-prompt", a.decode_prompt, int64_t{64});
  set("--estimator-lengths", a.estimator_lengths, std::vector<int64_t>{256});
  set("--bf16-lengths", a.bf16_lengths, std::vector<int64_t>{256});
  set("--backward-lengths", a.backward_lengths, std::vector<int64_t>{128, 256});
  set("--max-exact-backward-n", a.max_exact_backward_n, int64_t{256});
  set("--vq-lengths", a.vq_lengths, std::vector<int64_t>{256});
  set("--vq-codes", a.vq_codes, int64_t{16});
  set("--distributed-n", a.distributed_n, int64_t{1024});
  set("--distributed-weak-n", a.distributed_weak_n, int64_t{512});
  set("--distributed-ranks", a.distributed_ranks, std::vector<int>{1, 2});
  set("--io-n", a.io_n, int64_t{256});
  set("--call-lengths", a.call_lengths, std::vector<int64_t>{1, 64});
  a.repeats = 1;  // effort, not a choice: one run even where the command line asks for more
  a.min_time = 0.0;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Benchmark FAVOR and exact attention, decode and the BLAS yardstick");
  cmd->add_flag("--json", a->json, "print the records as a JSON array instead of the table");
  cmd->add_option("--out", a->out, "also write the JSON records to this file");
  cmd->add_option("--plot", a->plot,
                  "draw time vs N (log-log), favor vs exact, into this PNG (matplotlib)");
  cmd->add_option("--lengths", a->lengths, "sequence lengths of the sweep")->capture_default_str();
  cmd->add_option("--bh", a->bh, "batch x heads of the sweep")->capture_default_str();
  cmd->add_option("--dim", a->d, "head dim D = Dv")->capture_default_str();
  cmd->add_option("--features", a->m, "projections m")->capture_default_str();
  cmd->add_option("--kernel", a->kernel,
                  "positive | trig | hyperbolic | favorpp | favorsharp (all rows but "
                  "the estimators section)")
      ->capture_default_str();
  cmd->add_option("--estimator,--estimators", a->estimators,
                  "kernels of the estimators section, each timed against positive (FAVOR+)")
      ->capture_default_str();
  cmd->add_option("--estimator-lengths", a->estimator_lengths,
                  "N of the estimators and maps sections")
      ->capture_default_str();
  cmd->add_option("--bf16-lengths", a->bf16_lengths, "N of the bf16 section")
      ->capture_default_str();
  cmd->add_option("--max-exact-n", a->max_exact_n, "longest N for exact attention")
      ->capture_default_str();
  cmd->add_option("--scaling-n", a->scaling_n, "N of the one-thread vs all-threads rows")
      ->capture_default_str();
  cmd->add_option("--decode-positions", a->decode_positions, "decode positions to time")
      ->capture_default_str();
  cmd->add_option("--decode-batch", a->decode_batch,
                  "sequences B of the batched decode rows (step vs append + query, B x --bh "
                  "heads, at the first --decode-positions, at most 1024)")
      ->capture_default_str();
  cmd->add_option("--decode-prompt", a->decode_prompt,
                  "prompt length of the prefill rows (prefill vs causal attention + append; 0: "
                  "none)")
      ->capture_default_str();
  cmd->add_option("--sgemm-n", a->sgemm_n, "size of the yardstick sgemm")->capture_default_str();
  cmd->add_flag("!--no-sgemm-peers", a->sgemm_peers,
                "do not time numpy's and torch's sgemm beside favor's BLAS (the project venv's "
                "Python, FAVOR_PYTHON overrides; %best is then against favor's BLAS)");
  std::vector<std::string> names;
  for (const BenchSection& s : bench_sections()) names.push_back(s.name);
  cmd->add_option("--sections", a->sections, bench_sections_help(a->sections))
      ->capture_default_str()
      ->check(CLI::IsMember(names));
  cmd->add_option("--distributed-n", a->distributed_n,
                  "N of the distributed section's strong scaling (one sequence over P ranks)")
      ->capture_default_str();
  cmd->add_option("--distributed-weak-n", a->distributed_weak_n,
                  "tokens per rank of the distributed section's weak scaling")
      ->capture_default_str();
  cmd->add_option("--distributed-ranks", a->distributed_ranks,
                  "rank counts P of the distributed section (mpirun -np P)")
      ->capture_default_str();
  cmd->add_option("--io-n", a->io_n, "N of the io section (inputs [1, bh, N, dim])")
      ->capture_default_str();
  cmd->add_option("--call-lengths", a->call_lengths, "N of the calls section (short calls)")
      ->capture_default_str();
  cmd->add_option("--vq-lengths", a->vq_lengths,
                  "N of the vq section (N = 4096, seed 002's setting, is always added)")
      ->capture_default_str();
  cmd->add_option("--vq-codes", a->vq_codes, "codes c of the vq section")->capture_default_str();
  cmd->add_option("--vq-block", a->vq_block, "causal block length L of the vq section")
      ->capture_default_str();
  cmd->add_option("--backward-lengths", a->backward_lengths, "N of the backward rows")
      ->capture_default_str();
  cmd->add_option("--max-exact-backward-n", a->max_exact_backward_n, "longest N for exact backward")
      ->capture_default_str();
  cmd->add_option("--min-time", a->min_time,
                  "seconds of timed runs per row at least (short rows repeat)")
      ->capture_default_str();
  cmd->add_option("--repeats", a->repeats,
                  "timed repeats per row (median); runs over 1 s are timed once")
      ->capture_default_str();
  auto quick = std::make_shared<bool>(false);
  cmd->add_flag("--quick", *quick,
                "one run of every row, tiny sizes for every size not given (a smoke test of the "
                "command line as written: docs/reliability.md, \"Docs that run\")");
  cmd->callback([a, cmd, quick] {
    if (*quick) shrink_for_quick(*a, [cmd](const char* opt) { return cmd->count(opt) > 0; });
    run(*a);
  });
  add_distributed_bench_rank_command(app);  // the hidden command each rank runs (MPI builds)
}

}  // namespace favor::cli
