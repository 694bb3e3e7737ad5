#include "bench_io.hpp"

#include <fmt/core.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "favor/favor.hpp"
#include "io_names.hpp"
#include "workload.hpp"

extern char** environ;

namespace favor::cli {
namespace {

std::string self_path() {
  std::array<char, 4096> buf{};
  const ssize_t len = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (len <= 0) throw Error("bench --sections io: cannot find the favor executable");
  return std::string(buf.data(), static_cast<size_t>(len));
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("bench --sections io: cannot write " + path);
}

// A .npy of `t` as float32 or float64.
std::string npy_of(const Tensor& t, bool f64) {
  const auto& s = t.shape();
  const std::vector<int64_t> shape{s[0], s[1], s[2], s[3]};
  if (!f64) return encode_npy_f32(shape, t.data());
  std::vector<double> wide(t.values().begin(), t.values().end());
  return encode_npy("<f8", shape, wide.data(), wide.size() * sizeof(double));
}

// Wall seconds of one run of `argv` (from spawn to exit); throws if it fails.
double run_process(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0)
    throw Error("bench --sections io: cannot start " + args[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("bench --sections io: favor attention failed in the child process");
  return s;
}

}  // namespace

nlohmann::json io_section(const IoBenchArgs& a) {
  namespace fs = std::filesystem;
  std::string dir_template = (fs::temp_directory_path() / "favor-bench-io-XXXXXX").string();
  if (!mkdtemp(dir_template.data())) throw Error("bench --sections io: cannot make a temp folder");
  const fs::path dir(dir_template);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{dir};

  const double norm = std::pow(double(a.d), 0.25);  // as the other sections' inputs
  const Tensor q = gaussian_rows({1, a.bh, a.n, a.d}, 11, norm),
               k = gaussian_rows({1, a.bh, a.n, a.d}, 22, norm),
               v = gaussian_rows({1, a.bh, a.n, a.d}, 33);
  // What `favor attention` draws by default: m orthogonal rows, chi norms, seed 0, positive.
  const FeatureMap map(Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0}),
                       Kernel::positive);
  Tensor out({1, a.bh, a.n, a.d});
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    fmt::print("\nio: favor attention as a whole process vs the call inside this process\n");
    fmt::print("{:>7} {:>6} {:>7} {:>4} {:>12} {:>12} {:>9}\n", "dtype", "causal", "N", "BH",
               "compute s", "process s", "ratio");
  }
  for (bool f64 : {false, true}) {
    for (const char* name : {"q", "k", "v"}) {
      const Tensor& t = name[0] == 'q' ? q : name[0] == 'k' ? k : v;
      write_file((dir / (std::string(name) + ".npy")).string(), npy_of(t, f64));
    }
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      const double compute = median_seconds(
          [&] { favor_attention(q, k, v, map, out.mutable_view(), o); }, a.repeats, 1.0, 0.0);
      std::vector<std::string> cmd{self_path(), "attention",
                                   "--q",       (dir / "q.npy").string(),
                                   "--k",       (dir / "k.npy").string(),
                                   "--v",       (dir / "v.npy").string(),
                                   "--out",     (dir / "y.npy").string(),
                                   "--threads", std::to_string(a.threads)};
      if (causal) cmd.push_back("--causal");
      const double process =
          median_seconds([&] { run_process(cmd); }, a.repeats, 1e9, 0.0);  // always repeated
      nlohmann::json r = {{"section", "io"},
                          {"method", "favor"},
                          {"dtype", f64 ? "float64" : "float32"},
                          {"causal", causal},
                          {"n", a.n},
                          {"bh", a.bh},
                          {"threads", a.threads},
                          {"compute_seconds", compute},
                          {"process_seconds", process},
                          {"process_over_compute", process / compute},
                          {"input_mib", 3.0 * double(q.numel()) * (f64 ? 8 : 4) / 1048576.0}};
      if (!a.json) {
        fmt::print("{:>7} {:>6} {:>7} {:>4} {:>12.5f} {:>12.5f} {:>8.2f}x\n",
                   f64 ? "float64" : "float32", causal ? "yes" : "no", a.n, a.bh, compute, process,
                   process / compute);
      }
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

}  // namespace favor::cli
