// Reproducibility across compilers and thread counts: golden values kept in tests/golden/,
// generated once by the g++ Release build and checked by every build (CI runs the g++
// Release suite and the clang++ sanitizer suite, so both compilers check them).
//
// - Projections: an exact FNV-1a hash of the float bits of W for every valid (kind, norms)
//   at a few (m, d, seed). Drawn projections promise the same bits on every compiler
//   (projection.hpp); src/CMakeLists.txt builds their files with -ffp-contract=off and
//   scalar Eigen, Boost.Math runs in double, and std::log/cos/sqrt come from the same libm.
// - Attention outputs: compared with a worst-case float32 rounding bound (below), because
//   the summation order (SIMD target, GEMM blocking, contraction of a*b+c into FMA in the
//   kernels) may differ between builds and machines.
// - Thread counts: identical bits where the schedule gives each output to one thread
//   (docs/algorithms.md "Threads", docs/api.md Decoder).
//
// Regenerate (after an intended change of a definition) with the g++ Release build:
//   FAVOR_GOLDEN_WRITE=1 build/tests/favor_tests --gtest_filter='Golden.*'
// which rewrites tests/golden/*.txt in the source tree; review the diff before committing.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "slice_helpers.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_golden {
namespace {

const std::string kGoldenDir = FAVOR_GOLDEN_DIR;
constexpr double kUnit = 0x1p-24;  // float32 unit roundoff u

bool writing() {
  const char* w = std::getenv("FAVOR_GOLDEN_WRITE");
  return w != nullptr && *w != '\0' && std::string(w) != "0";
}

uint64_t fnv1a(const std::vector<float>& values) {
  uint64_t hash = 1469598103934665603ull;
  for (float x : values) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  return hash;
}

std::string hex(uint64_t x) {
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(x));
  return text;
}

// ---- projections ----

struct ProjectionCase {
  ProjectionKind kind;
  NormMode norms;
  int64_t m, d;
  uint64_t seed;
  std::string key() const {
    return to_string(kind) + ' ' + to_string(norms) + ' ' + std::to_string(m) + ' ' +
           std::to_string(d) + ' ' + std::to_string(seed);
  }
};

// Every valid (kind, norms) (projection.hpp) at m < d, m not a multiple of d and a d that is
// not a power of two (sorf pads to 64, dct and simplex blocks of 33).
std::vector<ProjectionCase> projection_cases() {
  const std::vector<std::pair<ProjectionKind, NormMode>> combos = {
      {ProjectionKind::iid, NormMode::chi},          {ProjectionKind::orthogonal, NormMode::chi},
      {ProjectionKind::orthogonal, NormMode::fixed}, {ProjectionKind::radial, NormMode::chi},
      {ProjectionKind::radial, NormMode::quantile},  {ProjectionKind::qmc, NormMode::chi},
      {ProjectionKind::sorf, NormMode::chi},         {ProjectionKind::sorf, NormMode::fixed},
      {ProjectionKind::simplex, NormMode::chi},      {ProjectionKind::simplex, NormMode::fixed},
      {ProjectionKind::dct, NormMode::chi},          {ProjectionKind::dct, NormMode::quantile}};
  const std::vector<std::tuple<int64_t, int64_t, uint64_t>> sizes = {
      {2, 3, 0}, {64, 16, 1}, {130, 33, 0x9e3779b97f4a7c15ull}};
  std::vector<ProjectionCase> cases;
  for (const auto& [kind, norms] : combos)
    for (const auto& [m, d, seed] : sizes) cases.push_back({kind, norms, m, d, seed});
  return cases;
}

std::map<std::string, uint64_t> read_projection_hashes() {
  std::ifstream in(kGoldenDir + "/projections.txt");
  std::map<std::string, uint64_t> hashes;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t cut = line.rfind(' ');
    hashes[line.substr(0, cut)] = std::strtoull(line.c_str() + cut + 1, nullptr, 16);
  }
  return hashes;
}

TEST(Golden, ProjectionBitsForEveryKindAndNormMode) {
  const auto cases = projection_cases();
  if (writing()) {
    std::ofstream out(kGoldenDir + "/projections.txt");
    out << "# FNV-1a 64 of the float bits of Projection::draw(m, d, {kind, norms, seed}),\n"
           "# row-major; written by tests/test_golden.cpp (FAVOR_GOLDEN_WRITE=1, g++ Release).\n"
           "# kind norms m d seed hash\n";
    for (const auto& c : cases)
      out << c.key() << ' '
          << hex(fnv1a(Projection::draw(c.m, c.d, {c.kind, c.norms, c.seed}).matrix())) << '\n';
    GTEST_SKIP() << "wrote " << kGoldenDir << "/projections.txt";
  }
  const auto expected = read_projection_hashes();
  ASSERT_EQ(expected.size(), cases.size()) << kGoldenDir << "/projections.txt";
  for (const auto& c : cases) {
    const auto it = expected.find(c.key());
    ASSERT_NE(it, expected.end()) << "no golden hash for " << c.key();
    const uint64_t hash = fnv1a(Projection::draw(c.m, c.d, {c.kind, c.norms, c.seed}).matrix());
    EXPECT_EQ(hex(hash), hex(it->second)) << c.key();
  }
}

// ---- attention outputs ----

// Inputs: B = 1, H = 2, N = 70 (two causal chunks of 32 and a tail), D = 8, Dv = 4, m = 24.
struct Inputs {
  Tensor q = testing::random_tensor({1, 2, 70, 8}, 11, 1.5);
  Tensor k = testing::random_tensor({1, 2, 70, 8}, 12, 1.5);
  Tensor v = testing::random_tensor({1, 2, 70, 4}, 13);
  Projection w = Projection::draw(24, 8, {ProjectionKind::orthogonal, NormMode::chi, 3});
};

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.values()) m = std::max(m, std::abs(double(x)));
  return m;
}

double max_row_norm(const Tensor& t) {
  const int64_t d = t.shape()[3];
  double worst = 0;
  for (int64_t r = 0; r < t.numel() / d; ++r) {
    double n2 = 0;
    for (int64_t x = 0; x < d; ++x) n2 += double(t.data()[r * d + x]) * t.data()[r * d + x];
    worst = std::max(worst, std::sqrt(n2));
  }
  return worst;
}

// Worst-case bound on |y - y'| between two float32 evaluations of attention in different
// orders. y_i = sum_j a_ij v_j / sum_j a_ij is a weighted mean, so relative errors e in the
// weights move it by at most 2 e max|v|. Per evaluation e <= (N + F + L + 8) u:
//   N  the sums over keys (state S, s or the softmax sums; nonnegative weights, linear bound),
//   F  the feature dot phi(q)^T S (F = m for FAVOR, 0 for exact attention),
//   L  the exponent's absolute error, which becomes a relative error of exp: a D-term dot
//      product of size |w||x| (FAVOR, plus |x|^2 / 2) or scale |q||k| (exact), D u of it each,
//   8  Highway's exp (a few ulps) and the final division.
// Two evaluations: twice that. This is the linear (worst-case) bound, not the typical
// sqrt(n) one, so it holds on any SIMD target and compiler.
double tolerance(const Inputs& in, bool favor) {
  const double N = in.k.shape()[2], D = in.k.shape()[3], scale = 1.0 / std::sqrt(D);
  const double qn = max_row_norm(in.q) * std::sqrt(std::sqrt(scale)),
               kn = max_row_norm(in.k) * std::sqrt(std::sqrt(scale));
  double L, F = 0;
  if (favor) {
    double wn = 0;
    for (int64_t r = 0; r < in.w.m(); ++r) {
      double n2 = 0;
      for (int64_t x = 0; x < in.w.d(); ++x) n2 += double(in.w.at(r, x)) * in.w.at(r, x);
      wn = std::max(wn, std::sqrt(n2));
    }
    const double xn = std::max(qn, kn);
    L = D * (wn * xn + xn * xn / 2) * 2;  // query and key features
    F = static_cast<double>(in.w.m());
  } else {
    L = D * qn * kn;
  }
  return 2 * 2 * (N + F + L + 8) * kUnit * max_abs(in.v);
}

std::vector<std::pair<std::string, Tensor>> attention_outputs(const Inputs& in) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    out.emplace_back(std::string("favor_positive_") + (causal ? "causal" : "bidirectional"),
                     favor_attention(in.q, in.k, in.v, in.w, o));
  }
  for (bool causal : {false, true}) {
    ExactOptions o;
    o.causal = causal;
    out.emplace_back(std::string("exact_") + (causal ? "causal" : "bidirectional"),
                     exact_attention(in.q, in.k, in.v, o));
  }
  return out;
}

TEST(Golden, AttentionOutputsWithinRoundingOfTheGoldenValues) {
  const Inputs in;
  const std::string path = kGoldenDir + "/attention.txt";
  // The inputs come from favor's RNG (bit-exact by definition): pin them too, so that a
  // mismatch below is the attention's and not the inputs'.
  const uint64_t input_hash =
      fnv1a(in.q.values()) ^ (fnv1a(in.k.values()) * 3) ^ (fnv1a(in.v.values()) * 5);
  const auto outputs = attention_outputs(in);
  if (writing()) {
    std::ofstream out(path);
    out << "# Outputs [1, 2, 70, 4] of tests/test_golden.cpp's cases as hex floats (g++ Release,\n"
           "# FAVOR_GOLDEN_WRITE=1). inputs: the hash of q, k, v.\n";
    out << "inputs " << hex(input_hash) << '\n';
    for (const auto& [name, y] : outputs) {
      out << name << ' ' << y.numel();
      for (float x : y.values()) {
        char text[40];
        std::snprintf(text, sizeof text, " %a", static_cast<double>(x));
        out << text;
      }
      out << '\n';
    }
    GTEST_SKIP() << "wrote " << path;
  }
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  std::map<std::string, std::vector<float>> golden;
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    if (name == "inputs") {
      std::string h;
      fields >> h;
      ASSERT_EQ(hex(input_hash), h) << "the test inputs changed";
      continue;
    }
    size_t count = 0;
    fields >> count;
    std::vector<float>& values = golden[name];
    for (size_t i = 0; i < count; ++i) {
      std::string text;
      fields >> text;
      values.push_back(std::strtof(text.c_str(), nullptr));
    }
  }
  for (const auto& [name, y] : outputs) {
    ASSERT_EQ(golden[name].size(), static_cast<size_t>(y.numel())) << name;
    const double tol = tolerance(in, name.rfind("favor", 0) == 0);
    double worst = 0;
    for (int64_t i = 0; i < y.numel(); ++i)
      worst = std::max(worst, std::abs(double(y.values()[i]) - golden[name][i]));
    EXPECT_LE(worst, tol) << name;
    std::printf("[ golden   ] %-28s max |y - golden| = %.3g (%.1f u max|v|), tolerance %.3g\n",
                name.c_str(), worst, worst / (kUnit * max_abs(in.v)), tol);
  }
}

// The same comparison on every SIMD target this CPU has (Highway's dispatch, forced per
// target): the exps and reductions change with the vector width, the bound above must hold.
TEST(Golden, AttentionOutputsOnEverySimdTargetWithinTheBound) {
  const Inputs in;
  if (writing()) GTEST_SKIP();
  const auto reference = attention_outputs(in);  // the best target; checked above
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    const auto outputs = attention_outputs(in);
    for (size_t c = 0; c < outputs.size(); ++c) {
      const auto& [name, y] = outputs[c];
      double worst = 0;
      for (int64_t i = 0; i < y.numel(); ++i)
        worst = std::max(worst, std::abs(double(y.values()[i]) - reference[c].second.values()[i]));
      EXPECT_LE(worst, tolerance(in, name.rfind("favor", 0) == 0))
          << name << " on " << hwy::TargetName(target);
      std::printf("[ golden   ] %-8s %-28s max |y - best target| = %.3g (%.1f u max|v|)\n",
                  hwy::TargetName(target), name.c_str(), worst, worst / (kUnit * max_abs(in.v)));
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

// ---- thread counts ----

// Each (batch, head) is one task when there are at least as many as threads, and exact
// attention gives each (head, query block) to one thread: the same operations in the same
// order, so the same bits for 1 and 2 threads.
TEST(Golden, HeadsAsTasksGiveTheSameBitsForAnyThreadCount) {
  testing::ThreadCount restore;
  const Tensor q = testing::random_tensor({2, 2, 90, 8}, 21, 1.5),
               k = testing::random_tensor({2, 2, 90, 8}, 22, 1.5),
               v = testing::random_tensor({2, 2, 90, 4}, 23);
  const Projection w = Projection::draw(32, 8);
  for (bool causal : {false, true}) {
    for (Kernel kernel : {Kernel::positive, Kernel::trig}) {
      AttentionOptions o;
      o.causal = causal;
      o.kernel = kernel;
      set_num_threads(1);
      const Tensor one = favor_attention(q, k, v, w, o);
      set_num_threads(2);
      EXPECT_EQ(favor_attention(q, k, v, w, o).values(), one.values())
          << to_string(kernel) << (causal ? " causal" : " bidirectional");
    }
  }
  // Exact attention: one head of 300 queries, three query blocks of 128.
  const Tensor eq = testing::random_tensor({1, 1, 300, 8}, 24, 2.0),
               ek = testing::random_tensor({1, 1, 300, 8}, 25, 2.0),
               ev = testing::random_tensor({1, 1, 300, 4}, 26);
  for (bool causal : {false, true}) {
    ExactOptions o;
    o.causal = causal;
    set_num_threads(1);
    const Tensor one = exact_attention(eq, ek, ev, o);
    set_num_threads(2);
    EXPECT_EQ(exact_attention(eq, ek, ev, o).values(), one.values()) << causal;
  }
}

// docs/api.md: the streaming decoder's result is the same for any thread count.
TEST(Golden, DecoderGivesTheSameBitsForAnyThreadCount) {
  testing::ThreadCount restore;
  // 2 x 4 heads, m = 256: a step is ~130k flops, past the ~50k below which it stays on the
  // calling thread.
  const Tensor k = testing::random_tensor({2, 4, 40, 16}, 31, 1.5),
               v = testing::random_tensor({2, 4, 40, 16}, 32),
               q = testing::random_tensor({2, 4, 40, 16}, 33, 1.5);
  const Projection w = Projection::draw(256, 16);
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Decoder dec(2, 4, 16, w);
    std::vector<float> all;
    // Prefill 32 tokens, then one token at a time (append, query) for the last 8.
    dec.append(testing::rows_of(k, 0, 32), testing::rows_of(v, 0, 32));
    const Tensor y0 = dec.query(testing::rows_of(q, 31, 32));
    all.insert(all.end(), y0.values().begin(), y0.values().end());
    for (int64_t t = 32; t < 40; ++t) {
      dec.append(testing::rows_of(k, t, t + 1), testing::rows_of(v, t, t + 1));
      const Tensor y = dec.query(testing::rows_of(q, t, t + 1));
      all.insert(all.end(), y.values().begin(), y.values().end());
    }
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace favor::test_golden
