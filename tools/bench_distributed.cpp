// favor bench --sections distributed (tools/bench_distributed.hpp): the parent launches
// mpirun per configuration; each rank times sequence-parallel attention on its slice.
#include "bench_distributed.hpp"

#include <fmt/core.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "cost_model.hpp"
#include "favor/distributed.hpp"
#include "favor/favor.hpp"
#include "workload.hpp"

namespace favor::cli {
namespace {

struct RankArgs {
  int64_t n = 0, bh = 8, d = 64, m = 256;
  bool causal = false, backward = false;
  int collective_repeats = 20;
  int repeats = 3;  // timed calls after a warm-up; the median is reported
};

// Rank 0's JSON line: the slowest rank's wall time, every rank's time inside MPI, the time of
// the state collective alone (after a barrier, mean of repeats) and the bytes per rank.
void run_rank(const RankArgs& a) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const distributed::Slice s = distributed::even_slice(a.n, rank, size);
    const Tensor q = gaussian_rows({1, a.bh, s.size(), a.d}, 100 + rank, 4.0);
    const Tensor k = gaussian_rows({1, a.bh, s.size(), a.d}, 200 + rank, 4.0);
    const Tensor v = gaussian_rows({1, a.bh, s.size(), a.d}, 300 + rank);
    ProjectionOptions po;
    const Projection w = Projection::draw(a.m, a.d, po);
    AttentionOptions o;
    o.causal = a.causal;
    distributed::MpiExchange ex;

    // The collective alone, on a block of the attention's size with live records (max 0,
    // nonzero values: combine_states does its arithmetic, as in a call).
    StateBlock block(a.bh, a.m * (a.d + 1));
    double collective = 0.0;
    for (int r = 0; r < a.collective_repeats; ++r) {
      for (int64_t h = 0; h < a.bh; ++h) {
        block.header(h).max = 0.0;
        std::fill(block.state(h), block.state(h) + block.size(), 1.0f);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (a.causal) {
        ex.exscan_states(block, false);
      } else {
        ex.allreduce_states(block);
      }
      collective += MPI_Wtime() - t0;
    }
    collective /= a.collective_repeats;

    // A warm-up call, then `repeats` timed calls; each rank reports its median call (and the
    // time inside MPI of that call).
    Tensor out({1, a.bh, s.size(), a.d});
    const Tensor dy = a.backward ? gaussian_rows({1, a.bh, s.size(), a.d}, 400 + rank) : Tensor();
    SequenceParallelStats st;
    const auto call = [&] {
      if (a.backward) {
        sequence_parallel_attention_backward(q, k, v, dy, w, o, ex, false, &st);
      } else {
        st = sequence_parallel_attention(q, k, v, w, out.mutable_view(), o, ex);
      }
    };
    std::vector<std::pair<double, double>> runs;  // (wall, inside MPI)
    for (int r = 0; r <= a.repeats; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      ex.reset_counters();
      const double t0 = MPI_Wtime();
      call();
      if (r > 0) runs.emplace_back(MPI_Wtime() - t0, ex.seconds());
    }
    std::sort(runs.begin(), runs.end());
    const double wall = runs[runs.size() / 2].first, in_mpi = runs[runs.size() / 2].second;
    // One rank: the plain single-process call on the same inputs, the baseline of the split.
    double plain = 0.0;
    if (size == 1) {
      std::vector<double> times;
      for (int r = 0; r <= a.repeats; ++r) {
        const double t0 = MPI_Wtime();
        if (a.backward) {
          favor_attention_backward(q, k, v, dy, w, o);
        } else {
          favor_attention(q, k, v, w, out.mutable_view(), o);
        }
        if (r > 0) times.push_back(MPI_Wtime() - t0);
      }
      std::sort(times.begin(), times.end());
      plain = times[times.size() / 2];
    }
    const auto bytes = static_cast<double>(st.payload_bytes);
    std::vector<double> walls(static_cast<size_t>(size)), mpis(static_cast<size_t>(size)),
        byte_counts(static_cast<size_t>(size));
    MPI_Gather(&wall, 1, MPI_DOUBLE, walls.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&in_mpi, 1, MPI_DOUBLE, mpis.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&bytes, 1, MPI_DOUBLE, byte_counts.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      nlohmann::json r{{"ranks", size},
                       {"n", a.n},
                       {"causal", a.causal},
                       {"pass", a.backward ? "backward" : "forward"},
                       {"seconds", *std::max_element(walls.begin(), walls.end())},
                       {"rank_seconds", walls},
                       {"rank_mpi_seconds", mpis},
                       {"payload_bytes_per_rank", byte_counts[0]},
                       {"collective_seconds", collective},
                       {"plain_seconds", plain},
                       {"threads", num_threads()}};
      fmt::print("{}\n", r.dump());
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
}

std::string self_path() {
  std::array<char, 4096> buf{};
  const ssize_t len = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (len <= 0) throw Error("bench --sections distributed: cannot find the favor executable");
  return std::string(buf.data(), static_cast<size_t>(len));
}

// One configuration under mpirun; returns rank 0's record.
nlohmann::json launch(const DistributedBenchArgs& a, int ranks, int64_t n, bool causal,
                      bool backward) {
  const int threads = std::max(1, a.threads / ranks);
  std::string cmd = fmt::format(
      "'{}' -np {} --oversubscribe --bind-to none{} -x FAVOR_NUM_THREADS={} -x "
      "OMP_NUM_THREADS={} '{}' distributed-bench-rank --n {} --bh {} --d {} --m {} --repeats "
      "{}{}{} "
      "2>&1",
      FAVOR_MPIEXEC, ranks, geteuid() == 0 ? " --allow-run-as-root" : "", threads, threads,
      self_path(), n, a.bh, a.d, a.m, a.repeats, causal ? " --causal" : "",
      backward ? " --backward" : "");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw Error("bench --sections distributed: cannot run " + cmd);
  std::string output, line;
  std::array<char, 4096> buf{};
  nlohmann::json record;
  while (fgets(buf.data(), static_cast<int>(buf.size()), pipe.get())) {
    line = buf.data();
    output += line;
    if (!line.empty() && line[0] == '{') record = nlohmann::json::parse(line);
  }
  const int status = pclose(pipe.release());
  if (status != 0 || record.is_null()) {
    throw Error("bench --sections distributed: mpirun failed (" + cmd +
                "): " + output.substr(0, 400));
  }
  return record;
}

}  // namespace

nlohmann::json distributed_section(const DistributedBenchArgs& a) {
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    fmt::print(
        "\ndistributed: sequence-parallel FAVOR+ over MPI ranks (mpirun on this machine), "
        "BH = {}, D = Dv = {}, m = {}; {} cores shared: max(1, {} / P) threads per rank\n",
        a.bh, a.d, a.m, a.threads, a.threads);
    fmt::print("{:>7} {:>4} {:>6} {:>8} {:>2} {:>3} {:>9} {:>8} {:>8} {:>10} {:>9} {:>10}\n",
               "scaling", "pass", "causal", "N", "P", "thr", "seconds", "plain/T", "GFLOP/s",
               "coll. ms", "in MPI", "bytes/rank");
  }
  struct Config {
    const char* scaling;
    bool causal, backward;
  };
  for (const Config& c : {Config{"strong", true, false}, Config{"strong", true, true},
                          Config{"strong", false, false}, Config{"weak", true, false}}) {
    double base = 0.0;
    for (int ranks : a.ranks) {
      const bool weak = std::string(c.scaling) == "weak";
      const int64_t n = weak ? a.weak_n * ranks : a.n;
      nlohmann::json r = launch(a, ranks, n, c.causal, c.backward);
      const double seconds = r["seconds"].get<double>();
      // The baseline: single-process favor_attention (or its backward) on the P = 1 inputs.
      if (base == 0.0) base = ranks == 1 ? r["plain_seconds"].get<double>() : seconds;
      if (ranks == 1 && !a.json) {
        fmt::print("{:>7} {:>4} {:>6} {:>8} {:>2} {:>3} {:>9.3f} {:>8} {:>8} {:>10} {:>9} {:>10}\n",
                   c.scaling, c.backward ? "bwd" : "fwd", c.causal ? "yes" : "no", n, "-",
                   r["threads"].get<int>(), r["plain_seconds"].get<double>(), "plain", "", "", "",
                   "");
      }
      const bench::Problem p{a.bh, n, a.d, a.d, a.m, a.m};
      const double flops = c.backward ? bench::favor_backward_flops(p, c.causal, 64)
                                      : bench::favor_flops(p, c.causal, 64);
      double in_mpi = 0.0;
      for (const auto& x : r["rank_mpi_seconds"]) in_mpi = std::max(in_mpi, x.get<double>());
      r["section"] = "distributed";
      r["scaling"] = c.scaling;
      r["method"] = "favor";
      r["bh"] = a.bh;
      r["d"] = a.d;
      r["m"] = a.m;
      r["gflops"] = flops / seconds / 1e9;
      // T(plain) / T(P): strong, the speedup over one process; weak, 1.0 is ideal (the same
      // time for P times the tokens, with a core per rank).
      r["speedup"] = base / seconds;
      r["mpi_share"] = in_mpi / seconds;
      r["collective_share"] = r["collective_seconds"].get<double>() / seconds;
      if (!a.json) {
        fmt::print(
            "{:>7} {:>4} {:>6} {:>8} {:>2} {:>3} {:>9.3f} {:>7.2f}x {:>8.1f} {:>10.3f} {:>8.1f}% "
            "{:>10}\n",
            c.scaling, c.backward ? "bwd" : "fwd", c.causal ? "yes" : "no", n, ranks,
            r["threads"].get<int>(), seconds, r["speedup"].get<double>(), r["gflops"].get<double>(),
            1e3 * r["collective_seconds"].get<double>(), 100.0 * r["mpi_share"].get<double>(),
            static_cast<int64_t>(r["payload_bytes_per_rank"].get<double>()));
        std::fflush(stdout);
      }
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

void add_distributed_bench_rank_command(CLI::App& app) {
  auto a = std::make_shared<RankArgs>();
  CLI::App* cmd = app.add_subcommand(
      "distributed-bench-rank", "one rank of favor bench --sections distributed (under mpirun)");
  cmd->group("");  // hidden: favor bench launches it
  cmd->add_option("--n", a->n)->required();
  cmd->add_option("--bh", a->bh);
  cmd->add_option("--d", a->d);
  cmd->add_option("--m", a->m);
  cmd->add_flag("--causal", a->causal);
  cmd->add_flag("--backward", a->backward);
  cmd->add_option("--repeats", a->repeats)->check(CLI::Range(1, 100));
  cmd->callback([a] { run_rank(*a); });
}

}  // namespace favor::cli
