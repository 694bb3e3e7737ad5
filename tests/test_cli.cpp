// The favor command-line tool, run as a process: results equal the library's, inputs are
// converted (float64, Fortran order, 2-D), and every failure exits with code 2, prints one
// line on stderr and leaves no output file behind (an existing one stays untouched).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_fixture.hpp"
#include "npy.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
namespace fs = std::filesystem;
using testing::random_tensor;

class Cli : public testing::CliTest {
 protected:
  Result run(const std::string& args) const { return run_cli(args); }
};

TEST_F(Cli, AttentionEqualsLibrary) {
  write_qkv();
  for (std::string kernel : {"positive", "trig", "hyperbolic"}) {
    for (bool causal : {false, true}) {
      const Result r =
          run("attention " + qkv() + " --out " + path("y.npy") + " --kernel " + kernel +
              " --features 24 --projection iid --seed 9 --scale 0.3" + (causal ? " --causal" : ""));
      ASSERT_EQ(r.code, 0) << r.err;
      AttentionOptions o;
      o.kernel = parse_kernel(kernel, "k");
      o.causal = causal;
      o.scale = 0.3;
      const Tensor expected = favor_attention(
          q, k, v, Projection::draw(24, 8, {ProjectionKind::iid, NormMode::chi, 9}), o);
      EXPECT_EQ(read("y.npy").values(), expected.values()) << kernel << causal;
    }
  }
  // dct projections (both norm modes) with the positive kernel: the same bits as the library.
  for (std::string norms : {"chi", "quantile"}) {
    const Result d = run("attention " + qkv() + " --out " + path("y.npy") +
                         " --features 16 --projection dct --norms " + norms + " --seed 4");
    ASSERT_EQ(d.code, 0) << d.err;
    const Tensor expected = favor_attention(
        q, k, v, Projection::draw(16, 8, {ProjectionKind::dct, parse_norm_mode(norms, "n"), 4}));
    EXPECT_EQ(read("y.npy").values(), expected.values()) << norms;
  }
  const Result r = run("attention " + qkv() + " --out " + path("e.npy") +
                       " --method exact --causal --accumulate f64");
  ASSERT_EQ(r.code, 0) << r.err;
  ExactOptions eo;
  eo.causal = true;
  eo.accumulation = Accumulation::f64;
  EXPECT_EQ(read("e.npy").values(), exact_attention(q, k, v, eo).values());
}

// FAVOR++ / FAVOR#: bidirectional attention fits itself; causal attention and features need
// --fit-a or --fit-q/--fit-k, and the CLI gives the library's result for the same fit.
TEST_F(Cli, AdaptedKernelsWithFits) {
  write_qkv();
  const Projection w = Projection::draw(16, 8, {ProjectionKind::orthogonal, NormMode::chi, 2});
  const std::string common = " --features 16 --seed 2 --out " + path("y.npy");
  ASSERT_EQ(run("attention " + qkv() + common + " --kernel favorsharp").code, 0);
  AttentionOptions o;
  o.kernel = Kernel::favorsharp;
  EXPECT_EQ(read("y.npy").values(), favor_attention(q, k, v, w, o).values());

  expect_failure("attention " + qkv() + common + " --kernel favorpp --causal", "--fit-a");
  ASSERT_EQ(run("attention " + qkv() + common + " --kernel favorpp --causal --fit-a -0.05").code,
            0);
  o.kernel = Kernel::favorpp;
  o.causal = true;
  o.fit = KernelFit::constant(-0.05, 8);
  EXPECT_EQ(read("y.npy").values(), favor_attention(q, k, v, w, o).values());

  ASSERT_EQ(run("features --x " + path("q.npy") +
                " --kernel favorsharp --features 16 --seed 2 "
                "--fit-q " +
                path("q.npy") + " --fit-k " + path("k.npy") + " --out " + path("phi.npy"))
                .code,
            0);
  FeatureOptions fo{Kernel::favorsharp, std::nullopt, fit_kernel(Kernel::favorsharp, q, k)};
  EXPECT_EQ(read("phi.npy").values(), features(q, w, fo).values());
  expect_failure("features --x " + path("q.npy") + " --kernel favorpp --out " + path("phi2.npy"),
                 "need a fit", "phi2.npy");
  expect_failure("attention " + qkv() + common + " --kernel positive --fit-a -0.1", "--fit-a");
  expect_failure("attention " + qkv() + common + " --kernel favorpp --fit-a 0.2", "1/8");
}

TEST_F(Cli, TwoDimensionalInputsAndMasks) {
  const Tensor q2 = random_tensor({1, 1, 30, 6}, 4, 1.0), k2 = random_tensor({1, 1, 30, 6}, 5, 1.0),
               v2 = random_tensor({1, 1, 30, 2}, 6);
  write("q.npy", q2, true);
  write("k.npy", k2, true);
  write("v.npy", v2, true);
  // A bool mask [Nk] and the same as int64: identical results, equal to the library's.
  std::string bool_mask = io::encode_npy_f32({30}, std::vector<float>(30).data());
  std::vector<uint8_t> flags(30);
  for (int j = 0; j < 30; ++j) flags[j] = j % 4 != 0;
  {
    std::string dict = "{'descr': '|b1', 'fortran_order': False, 'shape': (30,), }";
    dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
    dict += '\n';
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + char(dict.size()) + char(0) + dict;
    bytes.append(reinterpret_cast<const char*>(flags.data()), 30);
    write_bytes("mask.npy", bytes);
    std::string dict8 = "{'descr': '<i8', 'fortran_order': False, 'shape': (30,), }";
    dict8.append((64 - (10 + dict8.size() + 1) % 64) % 64, ' ');
    dict8 += '\n';
    std::string bytes8 = std::string("\x93NUMPY\x01\x00", 8) + char(dict8.size()) + char(0) + dict8;
    for (int j = 0; j < 30; ++j) {
      int64_t x = flags[j];
      bytes8.append(reinterpret_cast<const char*>(&x), 8);
    }
    write_bytes("mask8.npy", bytes8);
  }
  ASSERT_EQ(
      run("attention " + qkv() + " --out " + path("y.npy") + " --key-mask " + path("mask.npy"))
          .code,
      0);
  ASSERT_EQ(
      run("attention " + qkv() + " --out " + path("y8.npy") + " --key-mask " + path("mask8.npy"))
          .code,
      0);
  const io::NpyArray raw = io::read_float_npy(path("y.npy"), "t");
  EXPECT_EQ(raw.shape, (std::vector<int64_t>{30, 2}));
  AttentionOptions o;
  o.key_mask = KeyMaskView::contiguous(flags.data(), 1, 30);
  const Tensor expected = favor_attention(q2, k2, v2, Projection::draw(256, 6), o);
  EXPECT_EQ(read("y.npy").values(), expected.values());
  EXPECT_EQ(read("y8.npy").values(), expected.values());
}

TEST_F(Cli, Float64AndFortranOrderAreConverted) {
  write_qkv(12);
  // q as float64 in Fortran order: element (b, h, n, x) at offset b + B(h + H(n + N x)).
  const auto& s = q.shape();
  std::string dict = "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3, 12, 8), }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + char(dict.size()) + char(0) + dict;
  for (int64_t x = 0; x < s[3]; ++x)
    for (int64_t n = 0; n < s[2]; ++n)
      for (int64_t h = 0; h < s[1]; ++h)
        for (int64_t b = 0; b < s[0]; ++b) {
          const double val = q.at(b, h, n, x);
          bytes.append(reinterpret_cast<const char*>(&val), 8);
        }
  write_bytes("q.npy", bytes);
  ASSERT_EQ(run("attention " + qkv() + " --out " + path("y.npy")).code, 0);
  EXPECT_EQ(read("y.npy").values(), favor_attention(q, k, v, Projection::draw(256, 8)).values());
}

// A header mutated to hold terminal control sequences is quoted escaped: the one line on
// stderr holds printable ASCII only. Paths in UTF-8 are printed as they are.
TEST_F(Cli, MutatedHeadersAreEscapedOnTheTerminal) {
  write_qkv();
  const std::string dict =
      "{'descr': '\x1b]0;pwned\x07\x1b[2J<f4', 'fortran_order': False, 'shape': (2, 3, 40, 8), }\n";
  const std::string header = std::string("\x93NUMPY\x01\x00", 8) + char(dict.size()) + '\0' + dict;
  write_bytes("evil.npy", header + io::encode_npy_f32({2, 3, 40, 8}, q.data()).substr(128));
  const std::string out = " --out " + path("y.npy");
  const std::string args =
      "attention --q " + path("evil.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out;
  expect_failure(args, "dtype '\\x1b]0;pwned\\x07\\x1b[2J<f4' is not a plain numeric dtype");
  const Result r = run(args);
  for (char c : r.err) EXPECT_TRUE((c >= 0x20 && c < 0x7f) || c == '\n') << r.err;
  // A UTF-8 path is printed as it is.
  expect_failure("attention --q " + path("caf\xc3\xa9.npy") + " --k " + path("k.npy") + " --v " +
                     path("v.npy") + out,
                 "caf\xc3\xa9.npy: cannot open");
}

TEST_F(Cli, FeaturesAndProjectionRoundTrip) {
  const Tensor x = random_tensor({1, 2, 9, 4}, 7, 1.0);
  write("x.npy", x);
  ASSERT_EQ(run("features --x " + path("x.npy") + " --out " + path("phi.npy") +
                " --kernel hyperbolic --features 6 --seed 3 --save-projection " + path("w.npy"))
                .code,
            0);
  const Projection w = Projection::draw(6, 4, {ProjectionKind::orthogonal, NormMode::chi, 3});
  EXPECT_EQ(read("phi.npy").values(), features(x, w, {Kernel::hyperbolic, std::nullopt}).values());
  EXPECT_EQ(read("phi.npy").shape(), (Shape4{1, 2, 9, 12}));
  EXPECT_EQ(read("w.npy").values(), w.matrix());
  // Re-import the saved projection: same features.
  ASSERT_EQ(run("features --x " + path("x.npy") + " --out " + path("phi2.npy") +
                " --kernel hyperbolic --projection-file " + path("w.npy"))
                .code,
            0);
  EXPECT_EQ(read("phi2.npy").values(), read("phi.npy").values());
}

TEST_F(Cli, HelpAndVersion) {
  for (std::string sub : {"", "demo ", "attention ", "features ", "codebook "}) {
    const Result r = run(sub + "--help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("Usage: favor " + sub), std::string::npos) << sub << r.out;
  }
  const Result r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("favor 0."), std::string::npos);
  EXPECT_NE(r.out.find("; bf16 "), std::string::npos) << r.out;  // the backend line
}

// The usage line names the tool `favor`, not the path or file name it was started by (the
// wheel's console script runs favor/_bin/favor; a build runs build/tools/favor).
TEST_F(Cli, HelpNamesTheToolFavorWhateverItsPath) {
  const std::filesystem::path alias = dir / "favor_cli_main";
  std::filesystem::create_symlink(FAVOR_CLI_PATH, alias);
  const std::string cmd = alias.string() + " --help >" + path("stdout.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string out = slurp("stdout.txt");
  EXPECT_NE(out.find("Usage: favor [OPTIONS] SUBCOMMAND"), std::string::npos) << out;
  EXPECT_EQ(out.find(alias.string()), std::string::npos) << out;
  EXPECT_EQ(out.find("favor_cli_main"), std::string::npos) << out;
}

TEST_F(Cli, DemoJsonRuns) {
  const Result r = run("demo --json --lengths 64 130");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"relative_error\""), std::string::npos);
  EXPECT_NE(r.out.find("\"n\": 130"), std::string::npos);
}

TEST_F(Cli, ErrorsExitTwoWithOneLineAndNoOutput) {
  write_qkv();
  const std::string out = " --out " + path("y.npy");
  expect_failure("attention " + qkv() + out + " --kernel softmax",
                 "--kernel: 'softmax' is not a kernel");
  expect_failure("attention " + qkv() + out + " --features 0", "--features: 0 must be >= 1");
  expect_failure("attention " + qkv() + out + " --bogus", "bogus");
  expect_failure("attention --q " + path("q.npy") + out, "--k is required");
  expect_failure("attention " + qkv() + out + " --method softmax", "--method: 'softmax'");
  expect_failure("attention " + qkv() + out + " --scale -1", "scale: -1 must be finite and > 0");
  expect_failure("attention " + qkv() + out + " --projection-file " + path("w.npy") + " --seed 3",
                 "excludes");
  expect_failure("attention " + qkv() + out + " --threads 0", "threads: 0 must be >= 1");
  // Files: missing, empty, truncated, not .npy, wrong dtype, rank 3, NaN, shape mismatch.
  expect_failure("attention --q " + path("missing.npy") + " --k " + path("k.npy") + " --v " +
                     path("v.npy") + out,
                 "cannot open");
  write_bytes("empty.npy", "");
  expect_failure("attention --q " + path("empty.npy") + " --k " + path("k.npy") + " --v " +
                     path("v.npy") + out,
                 "empty file");
  const std::string full = io::encode_npy_f32({2, 3, 40, 8}, q.data());
  write_bytes("trunc.npy", full.substr(0, full.size() - 10));
  expect_failure("attention --q " + path("trunc.npy") + " --k " + path("k.npy") + " --v " +
                     path("v.npy") + out,
                 "truncated");
  write_bytes("text.npy", "hello, not an array");
  expect_failure(
      "attention --q " + path("text.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out,
      "bad magic");
  std::string ints = io::encode_npy_f32({2, 3, 40, 8}, q.data());
  ints.replace(ints.find("<f4"), 3, "<i4");
  write_bytes("ints.npy", ints);
  expect_failure(
      "attention --q " + path("ints.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out,
      "dtype '<i4' is not supported");
  write_bytes("r3.npy", io::encode_npy_f32({6, 40, 8}, q.data()));
  expect_failure(
      "attention --q " + path("r3.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out,
      "has rank 3");
  Tensor bad = q;
  bad.at(1, 2, 3, 4) = NAN;
  write("nan.npy", bad);
  expect_failure(
      "attention --q " + path("nan.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + out,
      "q: element [1,2,3,4] is nan");
  write("v2.npy", random_tensor({2, 3, 39, 5}, 1));
  expect_failure(
      "attention --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v2.npy") + out,
      "same length Nk");
  write("q2.npy", random_tensor({2, 3, 41, 8}, 1));
  expect_failure("attention --q " + path("q2.npy") + " --k " + path("k.npy") + " --v " +
                     path("v.npy") + out + " --causal",
                 "Nq == Nk");
  write_bytes("mask.npy", io::encode_npy_f32({2, 40}, std::vector<float>(80).data()));
  expect_failure("attention " + qkv() + out + " --key-mask " + path("mask.npy"),
                 "a mask is bool or 0/1 integers");
  expect_failure("attention " + qkv() + " --out " + path("no/such/dir/y.npy"),
                 "cannot create output", "no/such/dir/y.npy");
  write_bytes("w.npy", io::encode_npy_f32({4, 7}, std::vector<float>(28, 1.0f).data()));
  expect_failure("attention " + qkv() + out + " --projection-file " + path("w.npy"), "has D = 7");
  // An existing output file is left as it was when a later command fails.
  ASSERT_EQ(run("attention " + qkv() + out).code, 0);
  expect_failure("attention " + qkv() + out + " --kernel nope", "not a kernel");
  // features: overflow of the exact map is refused, the saved projection is not written.
  write("big.npy", random_tensor({1, 1, 3, 8}, 1, 60.0));
  expect_failure("features --x " + path("big.npy") + " --out " + path("phi.npy") +
                     " --kernel trig --scale 1 --save-projection " + path("wp.npy"),
                 "overflow float32", "phi.npy");
  EXPECT_FALSE(fs::exists(path("wp.npy")));
}

}  // namespace
}  // namespace favor

namespace favor {
namespace {

TEST_F(Cli, BenchWritesRecordsAndPlot) {
  const std::string args =
      "bench --lengths 64 96 --max-exact-n 96 --scaling-n 64 --decode-positions 8 40 --sgemm-n 64 "
      "--no-sgemm-peers --decode-batch 1 2 --decode-prompt 16 "
      "--backward-lengths 64 96 --estimator-lengths 64 --repeats 1 --min-time 0 --threads 2 "
      "--out " +
      path("bench.json") + " --plot " + path("bench.png");
  const Result r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(path("bench.json"));
  const nlohmann::json records = nlohmann::json::parse(in);
  std::set<std::string> methods;
  for (const auto& rec : records) {
    for (const char* field : {"method", "pass", "causal", "n", "d", "m", "bh", "seconds", "gflops",
                              "threads", "section"}) {
      EXPECT_TRUE(rec.contains(field)) << field << " missing in " << rec.dump();
    }
    EXPECT_GT(rec["seconds"].get<double>(), 0.0);
    if (rec["method"] == "state_rw") {  // a memory pass: no flops, its rate in GB/s
      EXPECT_TRUE(rec["gflops"].is_null()) << rec.dump();
      EXPECT_GT(rec["gbytes_per_s"].get<double>(), 0.0) << rec.dump();
      EXPECT_GT(rec["tokens_per_s"].get<double>(), 0.0) << rec.dump();
    } else {
      EXPECT_GT(rec["gflops"].get<double>(), 0.0) << rec.dump();
    }
    methods.insert(rec["method"].get<std::string>());
  }
  EXPECT_EQ(methods,
            (std::set<std::string>{"decode", "dec_split", "dec_step", "state_rw", "vq_split",
                                   "vq_step", "prefill", "causal+app", "vq_prefill",
                                   "vq_causal+app", "exact", "favor", "sgemm"}));
  // 1 sgemm + 2 lengths x 2 modes x (favor, exact) + 2 long + 8 scaling + 22 decode (2
  // positions, 2 batches x 2 thread counts x (split, step, state_rw), 2 VQ batches x (split,
  // step), prefill and causal+app, FAVOR and VQ) + backward:
  // 2 lengths x 2 modes x (favor fwd, favor bwd) and, at 64 <= max-exact-backward-n, exact fwd +
  // bwd.
  // ... + backward: 2 lengths x 2 modes x (favor fwd, favor bwd, exact fwd, exact bwd), and
  // for favor also the backward with a saved context (causal: the saved chunk states).
  // ... + estimators: 1 length x 2 modes x 5 kernels, each with its ratio to positive.
  EXPECT_EQ(records.size(), 1u + 8u + 2u + 8u + 22u + 20u + 10u);
  size_t backward = 0;
  std::set<std::string> estimators;
  for (const auto& rec : records) {
    backward += rec["pass"] == "backward" ? 1 : 0;
    if (rec["section"] != "estimators") continue;
    estimators.insert(rec["kernel"].get<std::string>());
    EXPECT_GT(rec["ratio_to_positive"].get<double>(), 0.0) << rec.dump();
    if (rec["kernel"] == "positive") EXPECT_EQ(rec["ratio_to_positive"].get<double>(), 1.0);
  }
  EXPECT_EQ(backward, 12u);
  EXPECT_EQ(estimators,
            (std::set<std::string>{"positive", "trig", "hyperbolic", "favorpp", "favorsharp"}));
  const std::string png = slurp("bench.png");
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

// A bad FAVOR_CPU (the switch of scripts/as-cpu.sh) stops the tool with one line naming it,
// before any output file.
TEST_F(Cli, ABadFavorCpuStopsWithOneLine) {
  write_qkv(6);
  ::setenv("FAVOR_CPU", "avx3", 1);
  expect_failure("attention " + qkv() + " --out " + path("y.npy"),
                 "FAVOR_CPU: 'avx3' must be native, avx512, avx2, sse4 or scalar");
  ::unsetenv("FAVOR_CPU");
}

// The yardstick: favor's BLAS and, in the same run, numpy's and torch's (the project venv,
// tools/sgemm_peers.py); every rated row is read against both, %best against the fastest.
TEST_F(Cli, BenchYardstickTimesNumpyAndTorchBesideFavorsBlas) {
  const Result r =
      run("bench --lengths 32 --sections sweep --max-exact-n 32 --sgemm-n 64 "
          "--repeats 1 --min-time 0 --threads 2 --out " +
          path("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("yardstick: favor's BLAS"), std::string::npos) << r.out;
  const nlohmann::json records = nlohmann::json::parse(slurp("b.json"));
  std::set<std::string> libraries;
  double best = 0.0, own = 0.0;
  for (const auto& rec : records) {
    if (rec["method"] != "sgemm") continue;
    libraries.insert(rec["library"].get<std::string>());
    EXPECT_FALSE(rec["blas"].get<std::string>().empty()) << rec.dump();
    best = std::max(best, rec["gflops"].get<double>());
    if (rec["library"] == "favor") own = rec["gflops"].get<double>();
  }
  EXPECT_EQ(libraries, (std::set<std::string>{"favor", "numpy", "torch"}));
  for (const auto& rec : records) {
    const double g = rec["gflops"].get<double>();
    EXPECT_NEAR(rec["percent_of_sgemm"].get<double>(), 100.0 * g / own, 1e-9) << rec.dump();
    EXPECT_NEAR(rec["percent_of_best_sgemm"].get<double>(), 100.0 * g / best, 1e-9) << rec.dump();
  }
}

TEST_F(Cli, BenchErrorsLeaveNoFiles) {
  expect_failure("bench --sections everything --out " + path("b.json"), "everything", "b.json");
  expect_failure("bench --lengths 0 --out " + path("b.json"), "--lengths: 0 must be >= 1",
                 "b.json");
  // A failing plot script: neither the JSON nor the PNG is left behind.
  ::setenv("FAVOR_PLOT_SCRIPT", path("missing.py").c_str(), 1);
  expect_failure(
      "bench --lengths 32 --sections sweep --max-exact-n 0 --sgemm-n 32 --repeats 1 --min-time 0 "
      "--out " +
          path("b.json") + " --plot " + path("b.png"),
      "--plot", "b.json");
  ::unsetenv("FAVOR_PLOT_SCRIPT");
  EXPECT_FALSE(fs::exists(path("b.png")));
}

}  // namespace
}  // namespace favor
