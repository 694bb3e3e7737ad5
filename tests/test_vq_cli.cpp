// Transformer-VQ in the favor CLI, run as a process: `attention --method vq` equals
// favor::vq_attention (given codebook or the k-means one it learns), `favor codebook` writes
// Codebook::kmeans with a non-increasing error trace, the bench and accuracy vq sections
// write the records they document, and every failure exits 2 with one line and no file.
// Rerun one with build/tests/favor_tests --gtest_filter='VQCli.<Name>'
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_fixture.hpp"
#include "npy.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::random_tensor;

class VQCli : public testing::CliTest {
 protected:
  void write_codebook(const std::string& name, const Tensor& c, bool shared) {
    const auto& s = c.shape();
    const std::vector<int64_t> shape =
        shared ? std::vector<int64_t>{s[2], s[3]} : std::vector<int64_t>{s[1], s[2], s[3]};
    write_bytes(name, io::encode_npy_f32(shape, c.data()));
  }
};

// The library's hard and soft VQ on the same inputs and codebook, bit for bit: per-head
// [H, c, D] and shared [c, D] files, causal, a key mask, --scale, --vq-block.
TEST_F(VQCli, AttentionWithCodebookEqualsLibrary) {
  write_qkv();
  const Tensor per_head = random_tensor({1, 3, 6, 8}, 4, 1.0),
               shared = random_tensor({1, 1, 6, 8}, 5, 1.0);
  write_codebook("c3.npy", per_head, false);
  write_codebook("c1.npy", shared, true);
  std::vector<uint8_t> flags(80, 1);
  for (int j = 0; j < 40; j += 3) flags[j] = 0;
  std::string mask = io::encode_npy_f32({2, 40}, std::vector<float>(80).data());
  {
    std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 40), }";
    dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
    dict += '\n';
    mask = std::string("\x93NUMPY\x01\x00", 8) + char(dict.size()) + char(0) + dict +
           std::string(flags.begin(), flags.end());
    write_bytes("mask.npy", mask);
  }
  for (const auto& [file, codebook] : {std::pair{"c3.npy", per_head}, std::pair{"c1.npy", shared}})
    for (bool causal : {false, true})
      for (double tau : {0.0, 0.7}) {
        const std::string args = "attention " + qkv() + " --out " + path("y.npy") +
                                 " --method vq --codes 6 --codebook " + path(file) +
                                 " --scale 0.3 --vq-block 7 --key-mask " + path("mask.npy") +
                                 " --vq-tau " + std::to_string(tau) + (causal ? " --causal" : "");
        const Result r = run_cli(args);
        ASSERT_EQ(r.code, 0) << args << "\n" << r.err;
        VQOptions o;
        o.causal = causal;
        o.scale = 0.3;
        o.tau = tau;
        o.block = 7;
        o.key_mask = KeyMaskView::contiguous(flags.data(), 2, 40);
        EXPECT_EQ(read("y.npy").values(), vq_attention(q, k, v, codebook, o).values()) << args;
      }
}

// Without --codebook: the k-means codebook of Codebook::kmeans (--codes, --seed,
// --vq-iterations), said on stderr, saved by --save-codebook; 2-D inputs give a [c, D] file.
TEST_F(VQCli, AttentionLearnsCodebookWithoutOne) {
  write_qkv();
  const Result r =
      run_cli("attention " + qkv() + " --out " + path("y.npy") +
              " --method vq --codes 5 --seed 3 --vq-iterations 4 --save-codebook " + path("c.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("learned 5 codes per head by k-means"), std::string::npos) << r.err;
  KMeansOptions ko;
  ko.iterations = 4;
  ko.seed = 3;
  const Codebook learned = Codebook::kmeans(k, 5, ko);
  const io::NpyArray saved = io::read_float_npy(path("c.npy"), "test");
  EXPECT_EQ(saved.shape, (std::vector<int64_t>{3, 5, 8}));
  EXPECT_EQ(saved.values, learned.values());
  EXPECT_EQ(read("y.npy").values(), vq_attention(q, k, v, learned.view()).values());

  write("q2.npy", random_tensor({1, 1, 20, 4}, 6, 1.0), true);
  write("k2.npy", random_tensor({1, 1, 20, 4}, 7, 1.0), true);
  write("v2.npy", random_tensor({1, 1, 20, 2}, 8), true);
  ASSERT_EQ(run_cli("attention --q " + path("q2.npy") + " --k " + path("k2.npy") + " --v " +
                    path("v2.npy") + " --out " + path("y2.npy") +
                    " --method vq --codes 20 --save-codebook " + path("c2.npy"))
                .code,
            0);
  EXPECT_EQ(io::read_float_npy(path("c2.npy"), "test").shape, (std::vector<int64_t>{20, 4}));
  EXPECT_EQ(read("y2.npy").shape(), (Shape4{1, 1, 20, 2}));
}

// Lloyd iterations never raise the mean squared quantisation error; the file holds
// Codebook::kmeans's values, per head [H, c, D] or shared [c, D], and feeds attention.
TEST_F(VQCli, CodebookCommandWritesKMeansWithFallingError) {
  write_qkv();
  for (bool shared : {false, true}) {
    const Result r =
        run_cli("codebook --k " + path("k.npy") + " --codes 6 --iterations 8 --seed 1" +
                (shared ? " --shared" : "") + " --out " + path("c.npy"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    std::vector<double> errors;
    while (std::getline(lines, line)) {
      const std::string head =
          "iteration " + std::to_string(errors.size()) + ": quantisation error ";
      ASSERT_EQ(line.rfind(head, 0), 0u) << line;
      errors.push_back(std::stod(line.substr(head.size())));
    }
    ASSERT_GE(errors.size(), 2u) << r.out;  // the seeding and at least one Lloyd iteration
    EXPECT_LE(errors.size(), 9u) << r.out;
    // Exact arithmetic: non-increasing. The float distances (|C|^2 - 2 k.C, float sums) may
    // flip a near tie and raise the mean by rounding: allow 1e-5 relative (~100 float ulps).
    for (size_t i = 1; i < errors.size(); ++i)
      EXPECT_LE(errors[i], errors[i - 1] * (1.0 + 1e-5)) << r.out;
    EXPECT_LT(errors.back(), errors.front()) << r.out;
    KMeansOptions ko;
    ko.iterations = 8;
    ko.seed = 1;
    const Codebook c = Codebook::kmeans(k, 6, ko, !shared);
    const io::NpyArray saved = io::read_float_npy(path("c.npy"), "test");
    EXPECT_EQ(saved.shape, (shared ? std::vector<int64_t>{6, 8} : std::vector<int64_t>{3, 6, 8}));
    EXPECT_EQ(saved.values, c.values());
    EXPECT_NEAR(errors.back(), c.quantisation_error(k), 1e-6 * errors.back());
    ASSERT_EQ(run_cli("attention " + qkv() + " --out " + path("y.npy") +
                      " --method vq --codebook " + path("c.npy"))
                  .code,
              0);
    EXPECT_EQ(read("y.npy").values(), vq_attention(q, k, v, c.view()).values());
  }
}

TEST_F(VQCli, ErrorsExitTwoWithOneLineAndNoOutput) {
  write_qkv(10);
  write_codebook("c.npy", random_tensor({1, 3, 4, 8}, 4), false);
  write_codebook("c2h.npy", random_tensor({1, 2, 4, 8}, 4), false);
  write_codebook("c7.npy", random_tensor({1, 1, 4, 7}, 4), true);
  write_bytes("c1.npy", io::encode_npy_f32({32}, random_tensor({1, 1, 4, 8}, 4).data()));
  const std::string vq = "attention " + qkv() + " --out " + path("y.npy") + " --method vq ";
  const std::string cb = " --codebook " + path("c.npy");
  expect_failure(vq + "--codes 0", "--codes: 0 must be >= 1");
  expect_failure(vq + "--codes 21", "--codes: 21 codes need at least as many keys");
  expect_failure(vq, "--codes");
  expect_failure(vq + "--codes 3" + cb, "--codes: 3 disagrees with --codebook");
  expect_failure(vq + "--codebook " + path("c7.npy"), "has D = 7");
  expect_failure(vq + "--codebook " + path("c2h.npy"), "has 2 heads");
  expect_failure(vq + "--codebook " + path("c1.npy"), "has rank 1");
  expect_failure(vq + "--codebook " + path("missing.npy"), "cannot open");
  expect_failure(vq + cb + " --vq-tau -1", "--vq-tau: -1 must be finite and >= 0");
  expect_failure(vq + cb + " --vq-block -2", "--vq-block");
  expect_failure(vq + "--codes 4 --causal", "--codebook: causal vq attention needs a codebook");
  expect_failure(vq + cb + " --save-codebook " + path("no/dir/c.npy"), "--save-codebook");
  EXPECT_FALSE(fs::exists(path("no")));

  const std::string c = "codebook --k " + path("k.npy") + " --out " + path("o.npy");
  expect_failure(c + " --codes 0", "--codes: 0 must be >= 1", "o.npy");
  expect_failure(c + " --codes 21", "--codes: 21", "o.npy");
  expect_failure(c + " --codes 4 --iterations -1", "--iterations", "o.npy");
  expect_failure("codebook --k " + path("missing.npy") + " --codes 2 --out " + path("o.npy"),
                 "cannot open", "o.npy");
  expect_failure("codebook --k " + path("k.npy") + " --out " + path("o.npy"), "--codes", "o.npy");
  expect_failure("codebook --k " + path("k.npy") + " --codes 2 --out " + path("no/dir/o.npy"),
                 "--out", "no/dir/o.npy");
}

TEST_F(VQCli, BenchSectionWritesRatiosAndCrossovers) {
  const Result r = run_cli(
      "bench --sections vq --vq-lengths 64 128 --vq-codes 16 --vq-block 16 --bh 2 --dim 8 "
      "--features 16 --max-exact-backward-n 128 --sgemm-n 64 --no-sgemm-peers --repeats 1 "
      "--min-time 0 --threads 2 --out " +
      path("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const json records = json::parse(slurp("b.json"));
  std::set<std::string> methods;
  size_t vq_rows = 0, with_exact = 0;
  std::set<int64_t> lengths;
  for (const json& rec : records) {
    methods.insert(rec["method"].get<std::string>());
    EXPECT_GT(rec["seconds"].get<double>(), 0.0) << rec.dump();
    if (rec["method"] == "sgemm") continue;
    EXPECT_EQ(rec["section"], "vq");
    lengths.insert(rec["n"].get<int64_t>());
    EXPECT_FALSE(rec["seed002_setting"].get<bool>()) << rec.dump();  // bh 2, not 8 heads of 64
    if (rec["method"] != "vq") continue;
    ++vq_rows;
    EXPECT_EQ(rec["codes"], 16);
    EXPECT_EQ(rec["codebook"], "keys");
    EXPECT_GT(rec["ratio_to_favor"].get<double>(), 0.0);
    EXPECT_TRUE(rec.contains("exact_crossover")) << rec.dump();
    EXPECT_GT(rec["gflops"].get<double>(), 0.0) << rec.dump();  // forward and backward rated
    if (rec["ratio_to_exact"].is_number()) ++with_exact;
  }
  EXPECT_EQ(methods, (std::set<std::string>{"sgemm", "favor", "exact", "vq"}));
  EXPECT_EQ(lengths, (std::set<int64_t>{64, 128, 4096}));  // 4096: seed 002's N, always added
  // 3 N x 2 modes x (fwd, bwd); exact forward at every N, exact backward up to 128.
  EXPECT_EQ(vq_rows, 12u);
  EXPECT_EQ(with_exact, 6u + 4u);
  // sgemm + 3 N x 2 modes x (favor fwd, exact fwd, vq fwd, favor bwd, vq bwd) + 4 exact bwd.
  EXPECT_EQ(records.size(), 1u + 30u + 4u);
}

// The vq section evaluates on the second half of each sequence (N = 64: 32 positions).
// In-sample (--vq-fit same): codes clipped to the 32 evaluated keys (64, 100 -> 32, the
// repeat dropped); hard VQ error falls as c grows and vanishes at c = 32, where every key is
// its own code. Held out (the default): the codebook comes from the first half, so even 32
// codes leave an error, and the record says which fit it used.
TEST_F(VQCli, AccuracySectionRuns) {
  const std::string common =
      "accuracy --json --sections vq --n 64 --d 8 --dv 4 --seeds 2 --vq-codes 4,16,64,100 "
      "--vq-tau-rel 0,1 --vq-iterations 6";
  const Result r = run_cli(common + " --vq-fit same");
  ASSERT_EQ(r.code, 0) << r.err;
  const json result = json::parse(r.out);
  EXPECT_TRUE(result["records"].empty());
  EXPECT_EQ(result["meta"]["sections"], json({"vq"}));
  EXPECT_EQ(result["meta"]["vq_fit"], "same");
  const json& records = result["vq_records"];
  ASSERT_EQ(records.size(), 6u);
  std::vector<double> hard;
  for (const json& rec : records) {
    for (const char* key :
         {"data", "codes", "fit", "evaluated_positions", "seeds", "soft", "tau_rel", "tau",
          "attention_rel_error", "attention_rel_error_std", "quantisation_error", "favor_m",
          "favor_rel_error", "favor_rel_error_std", "zero_rows"})
      ASSERT_TRUE(rec.contains(key)) << key << " in " << rec.dump();
    EXPECT_EQ(rec["favor_m"], rec["codes"]);
    EXPECT_EQ(rec["fit"], "same");
    EXPECT_EQ(rec["evaluated_positions"], 32);
    EXPECT_GT(rec["favor_rel_error"].get<double>(), 0.0);
    if (!rec["soft"].get<bool>()) hard.push_back(rec["attention_rel_error"].get<double>());
  }
  ASSERT_EQ(hard.size(), 3u);
  EXPECT_LT(hard[1], hard[0]);
  // c = 32 = N: every key is a code, hard VQ is exact attention up to float32 rounding
  // (~1e-6; one key on a wrong code would give ~1e-2).
  EXPECT_LT(hard[2], 1e-4);
  EXPECT_EQ(records[4]["codes"], 32);

  const Result h = run_cli(common);
  ASSERT_EQ(h.code, 0) << h.err;
  const json held = json::parse(h.out)["vq_records"];
  ASSERT_EQ(held.size(), 6u);
  EXPECT_EQ(held[4]["fit"], "heldout");
  // Held out, 32 codes from other keys do not contain the evaluated ones.
  EXPECT_GT(held[4]["attention_rel_error"].get<double>(), 1e-3);

  // User files, both sections; a --vq-* option without the section is refused.
  write("q.npy", random_tensor({1, 2, 24, 8}, 1, 1.0));
  write("k.npy", random_tensor({1, 2, 24, 8}, 2, 1.0));
  const Result f =
      run_cli("accuracy --json --sections favor,vq --q " + path("q.npy") + " --k " + path("k.npy") +
              " --estimators positive --projections iid "
              "--features 4 --seeds 1 --vq-codes 8 --vq-tau-rel 0");
  ASSERT_EQ(f.code, 0) << f.err;
  const json fr = json::parse(f.out);
  EXPECT_EQ(fr["records"].size(), 1u);
  EXPECT_EQ(fr["vq_records"].size(), 1u);
  EXPECT_EQ(fr["vq_records"][0]["data"], "files");
  for (const auto& [args, fragment] : {std::pair{"--vq-codes 8", "only with --sections vq"},
                                       std::pair{"--sections vq --vq-codes 0", "--vq-codes"},
                                       std::pair{"--sections vq --vq-tau-rel -1", "--vq-tau-rel"},
                                       std::pair{"--sections vq --vq-fit all", "--vq-fit"},
                                       std::pair{"--sections bogus", "--sections"}}) {
    const Result e = run_cli(std::string("accuracy --n 8 --d 4 --seeds 1 ") + args + " --out " +
                             path("acc.json"));
    EXPECT_EQ(e.code, 2) << args << e.err;
    EXPECT_NE(e.err.find(fragment), std::string::npos) << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
    EXPECT_FALSE(fs::exists(path("acc.json")));
  }
}

// --causal with an odd sequence length: queries and keys are both evaluated from position
// N / 2 (the query half used to start one position later, which causal attention refused).
TEST_F(VQCli, AccuracySectionCausalOddLength) {
  const Result r = run_cli(
      "accuracy --json --causal --sections vq --n 65 --d 8 --dv 8 "
      "--seeds 1 --vq-codes 4 --vq-tau-rel 0 --vq-iterations 3");
  ASSERT_EQ(r.code, 0) << r.err;
  const json out = json::parse(r.out);
  ASSERT_EQ(out["vq_records"].size(), 1u);
  EXPECT_EQ(out["vq_records"][0]["evaluated_positions"], 33);
}

// --causal in the vq section (in-sample, evaluated on positions 20..39): with c = 40 codes
// (per head, over B = 2 sequences of 20 keys) every key is its own code and hard VQ is causal exact
// attention, so the causal baseline and VQ agree; at c = 4 hard and soft VQ and FAVOR+ beside them
// are the library's causal ones with the same k-means codebooks and projections, and differ from
// the bidirectional run.
TEST_F(VQCli, AccuracySectionCausal) {
  write_qkv();
  const std::string args = "accuracy --json --sections vq " + qkv() +
                           " --seeds 2 --vq-codes 4,40 --vq-tau-rel 0,1 --vq-iterations 6 "
                           "--vq-fit same --scale 0.5";
  const Result c = run_cli(args + " --causal"), b = run_cli(args);
  ASSERT_EQ(c.code, 0) << c.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const json causal = json::parse(c.out), bidirectional = json::parse(b.out);
  EXPECT_EQ(causal["meta"]["causal"], true);
  EXPECT_EQ(bidirectional["meta"]["causal"], false);
  const json &records = causal["vq_records"], &other = bidirectional["vq_records"];
  ASSERT_EQ(records.size(), 4u);
  ASSERT_EQ(other.size(), 4u);
  EXPECT_EQ(records[2]["codes"], 40);
  EXPECT_LT(records[2]["attention_rel_error"].get<double>(), 1e-4) << records[2].dump();
  const TensorView hq = testing::positions(q, 20, 20), hk = testing::positions(k, 20, 20),
                   hv = testing::positions(v, 20, 20);
  ExactOptions eo;
  eo.causal = true;
  eo.scale = 0.5;
  eo.accumulation = Accumulation::f64;
  const Tensor exact = exact_attention(hq, hk, hv, eo);
  double vq[2] = {0.0, 0.0}, fv = 0.0;
  for (uint64_t seed = 0; seed < 2; ++seed) {
    KMeansOptions ko;
    ko.iterations = 6;
    ko.seed = seed;
    const Codebook codebook = Codebook::kmeans(hk, 4, ko);
    for (int t = 0; t < 2; ++t) {
      VQOptions o;
      o.causal = true;
      o.scale = 0.5;
      o.tau = t * codebook.quantisation_error(hk);
      vq[t] += relative_frobenius_error(vq_attention(hq, hk, hv, codebook.view(), o), exact) / 2.0;
    }
    AttentionOptions fo;
    fo.causal = true;
    fo.scale = 0.5;
    const Projection w = Projection::draw(4, 8, {ProjectionKind::orthogonal, NormMode::chi, seed});
    fv += relative_frobenius_error(favor_attention(hq, hk, hv, w, fo), exact) / 2.0;
  }
  for (int t = 0; t < 2; ++t) {
    const json &r = records[t], &o = other[t];
    EXPECT_EQ(r["codes"], 4);
    EXPECT_NEAR(r["attention_rel_error"].get<double>(), vq[t], 1e-6 * vq[t]) << r.dump();
    EXPECT_NEAR(r["favor_rel_error"].get<double>(), fv, 1e-6 * fv) << r.dump();
    EXPECT_EQ(r["quantisation_error"], o["quantisation_error"]) << r.dump();
    EXPECT_GT(std::abs(o["attention_rel_error"].get<double>() - vq[t]), 1e-3 * vq[t]) << o.dump();
    EXPECT_GT(std::abs(o["favor_rel_error"].get<double>() - fv), 1e-3 * fv) << o.dump();
  }
}

}  // namespace
}  // namespace favor
