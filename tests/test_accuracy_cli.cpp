// `favor accuracy`, run as a process: the JSON schema and sizes, statistics that can fail
// (error falls with m; kernel MSE matches the iid closed form within a seed-derived bound),
// --out equal to --json, one-line exit-2 failures that write nothing, .npy inputs, the plot.
// Reproducible: fixed data seed (default 1234) and projection seeds 0..S-1; rerun one with
//   build/tests/favor_tests --gtest_filter='AccuracyCli.<Name>'
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "cli_fixture.hpp"
#include "npy.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::random_tensor;

class AccuracyCli : public testing::CliTest {
 protected:
  Result run(const std::string& args, const std::string& env = "") const {
    return run_cli("accuracy " + args, env);
  }
  json run_json(const std::string& args) const {
    const Result r = run("--json " + args);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
    return json::parse(r.out);
  }
  // Exit code 2, one line on stderr containing `fragment`, no output file, no temporaries.
  void expect_failure(const std::string& args, const std::string& fragment,
                      const std::string& env = "") {
    const Result r = run(args + " --out " + path("acc.json"), env);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(path("acc.json"))) << args;
    for (const auto& entry : fs::directory_iterator(dir)) {
      EXPECT_EQ(entry.path().string().find(".partial-"), std::string::npos) << entry.path();
    }
  }
};

// The mean attention error of (estimator, projection, m) in a result with one data setting.
double error_of(const json& result, const std::string& estimator, const std::string& projection,
                int64_t m) {
  for (const json& r : result["records"]) {
    if (r["estimator"] == estimator && r["projection"] == projection && r["m"] == m)
      return r["attention_rel_error"].get<double>();
  }
  ADD_FAILURE() << "no record " << estimator << "/" << projection << " m=" << m;
  return 0.0;
}

TEST_F(AccuracyCli, JsonSchemaAndSizes) {
  const std::vector<std::string> estimators{"positive", "trig", "hyperbolic", "favorpp",
                                            "favorsharp"};
  const std::vector<std::string> projections{"iid", "orthogonal", "radial",
                                             "qmc", "sorf",       "simplex"};
  const std::vector<int64_t> ms{4, 16};
  const int64_t d = 8;
  const json result =
      run_json("--n 24 --d 8 --dv 4 --features 4,16 --seeds 2 --qk-norm 1,1.5 --kernel-pairs 8");
  const json& meta = result["meta"];
  for (const char* key :
       {"n", "nk", "batch", "heads", "d", "dv", "scale", "causal", "seeds", "threads", "version",
        "data_seed", "kernel_pairs", "estimators", "projections", "features", "data"}) {
    EXPECT_TRUE(meta.contains(key)) << key;
  }
  EXPECT_EQ(meta["causal"], false);
  EXPECT_EQ(meta["n"], 24);
  EXPECT_EQ(meta["d"], d);
  EXPECT_EQ(meta["dv"], 4);
  EXPECT_DOUBLE_EQ(meta["scale"].get<double>(), 1.0 / std::sqrt(8.0));
  EXPECT_EQ(meta["kernel_pairs"], json({8, 24}));
  EXPECT_EQ(meta["estimators"], json(estimators));
  EXPECT_EQ(meta["projections"], json(projections));
  ASSERT_EQ(meta["data"].size(), 2u);
  std::set<std::string> labels;
  for (const json& s : meta["data"]) labels.insert(s["label"].get<std::string>());
  EXPECT_EQ(labels.size(), 2u);

  const json& records = result["records"];
  ASSERT_TRUE(records.is_array());
  EXPECT_EQ(records.size(), 2 * estimators.size() * projections.size() * ms.size());
  std::set<std::tuple<std::string, std::string, std::string, int64_t>> seen;
  for (const json& r : records) {
    for (const char* key : {"data", "estimator", "projection", "m", "features", "seeds",
                            "attention_rel_error", "attention_rel_error_std", "kernel_mse",
                            "kernel_mse_std", "kernel_rel_mse", "zero_rows"}) {
      ASSERT_TRUE(r.contains(key)) << key << " in " << r.dump();
    }
    const std::string e = r["estimator"], p = r["projection"];
    const int64_t m = r["m"];
    EXPECT_TRUE(labels.count(r["data"].get<std::string>())) << r.dump();
    EXPECT_TRUE(seen.insert({r["data"], e, p, m}).second) << "duplicate " << r.dump();
    EXPECT_EQ(r["features"].get<int64_t>(), (e == "trig" || e == "hyperbolic") ? 2 * m : m);
    EXPECT_EQ(r["seeds"], 2);
    const double err = r["attention_rel_error"], sd = r["attention_rel_error_std"];
    EXPECT_TRUE(std::isfinite(err) && err > 0.0) << r.dump();
    EXPECT_TRUE(std::isfinite(sd) && sd >= 0.0) << r.dump();
    EXPECT_GE(r["kernel_mse"].get<double>(), 0.0);
    EXPECT_GE(r["zero_rows"].get<int64_t>(), 0);
    // Closed forms exist for iid projections (every estimator); the orthogonal bound for
    // positive features with m <= d.
    EXPECT_EQ(r.contains("kernel_mse_closed_form"), p == "iid") << r.dump();
    EXPECT_EQ(r.contains("kernel_mse_upper_bound"), p == "orthogonal" && e == "positive" && m <= d)
        << r.dump();
  }
}

TEST_F(AccuracyCli, SyntheticSettingsHaveTheRequestedNormsAndCosines) {
  const json result = run_json(
      "--n 256 --d 64 --dv 4 --features 4 --seeds 1 --estimators positive --projections iid "
      "--qk-norm 2,4 --qk-cos -0.5,0,0.8");
  ASSERT_EQ(result["meta"]["data"].size(), 6u);
  for (const json& s : result["meta"]["data"]) {
    const double r = s["qk_norm"], c = s["qk_cos"];
    // Every row has norm r exactly (to float rounding); |x| = r sqrt(scale) = r / sqrt(8).
    EXPECT_NEAR(s["x_norm_mean"].get<double>(), r / std::sqrt(8.0), 1e-5) << s.dump();
    EXPECT_NEAR(s["y_norm_mean"].get<double>(), r / std::sqrt(8.0), 1e-5) << s.dump();
    // The mean cosine over 256 x 256 pairs: c up to O(1/sqrt(N D)) fluctuations and the
    // O(1/D) shrinkage of the normalisation.
    EXPECT_NEAR(s["mean_cos"].get<double>(), c, 0.03) << s.dump();
  }
}

TEST_F(AccuracyCli, ErrorDecreasesWithFeatures) {
  // The attention error of unbiased estimators falls like m^-1/2: m = 16 -> 1024 should
  // divide it by about 8; require 2 for FAVOR+ with orthogonal projections (the claim the
  // plot makes), and a strict decrease for the other estimators.
  const json result =
      run_json("--n 128 --d 32 --dv 8 --features 16,1024 --seeds 2 --projections orthogonal");
  ASSERT_EQ(result["records"].size(), 10u);
  EXPECT_LT(error_of(result, "positive", "orthogonal", 1024),
            error_of(result, "positive", "orthogonal", 16) / 2.0);
  for (const char* e : {"trig", "hyperbolic", "favorpp", "favorsharp"}) {
    EXPECT_LT(error_of(result, e, "orthogonal", 1024), error_of(result, e, "orthogonal", 16)) << e;
  }
}

TEST_F(AccuracyCli, KernelMseMatchesClosedForm) {
  // With iid projections every seed's MSE over the pairs is an unbiased estimate of the
  // closed form (math.md s.4 is the exact expectation per pair), and the S = 16 seeds are
  // independent, so t = (mean - closed form) / (std / sqrt(S)) is roughly Student-t with 15
  // degrees of freedom: |t| > 4 has probability ~1e-3. The heavy tails that make the sample
  // std unreliable are kept small: |x| = |y| = 0.5 (|q| = 1, scale 1/4), so |z|^2 <= 1.
  const json result = run_json(
      "--n 64 --d 16 --dv 4 --qk-norm 1 --qk-cos 0,0.5 --features 8,64 --seeds 16 "
      "--projections iid");
  ASSERT_EQ(result["records"].size(), 20u);
  for (const json& r : result["records"]) {
    ASSERT_TRUE(r.contains("kernel_mse_closed_form")) << r.dump();
    const double mean = r["kernel_mse"], sd = r["kernel_mse_std"],
                 closed = r["kernel_mse_closed_form"];
    EXPECT_GT(closed, 0.0) << r.dump();
    EXPECT_LE(std::abs(mean - closed), 4.0 * sd / std::sqrt(16.0)) << r.dump();
    EXPECT_NEAR(r["kernel_rel_mse"].get<double>() / r["kernel_rel_mse_closed_form"].get<double>(),
                mean / closed, 1e-9);
  }
}

TEST_F(AccuracyCli, OutFileEqualsJsonAndTableGoesToStdout) {
  const std::string args =
      "--n 32 --d 8 --dv 4 --features 4,8 --seeds 2 --estimators positive,hyperbolic "
      "--projections iid,orthogonal";
  const json printed = run_json(args);
  const Result r = run(args + " --out " + path("acc.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(slurp("acc.json")), printed);
  EXPECT_TRUE(r.err.empty()) << r.err;  // no progress unless --progress or a terminal
  EXPECT_NE(r.out.find("attn rel err"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 5 + 8) << r.out;  // header + rows
  EXPECT_EQ(r.out.find('{'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("causal"), std::string::npos) << r.out;  // bidirectional by default
}

TEST_F(AccuracyCli, ProgressOnlyOnStderr) {
  const Result r =
      run("--json --progress --n 16 --d 4 --dv 2 --features 2,4 --seeds 1 --estimators positive "
          "--projections iid,orthogonal");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["records"].size(), 4u);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 4) << r.err;
  EXPECT_NE(r.err.find("accuracy: 1/4 positive/iid m=2\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("accuracy: 4/4 positive/orthogonal m=4\n"), std::string::npos) << r.err;
}

TEST_F(AccuracyCli, BadParametersExitTwoWithOneLineAndNoFile) {
  write("q.npy", random_tensor({1, 2, 10, 8}, 1, 1.0));
  write("k.npy", random_tensor({1, 2, 10, 8}, 2, 1.0));
  write("k6.npy", random_tensor({1, 2, 10, 6}, 3, 1.0));
  write("v9.npy", random_tensor({1, 2, 9, 3}, 4));
  write("k12.npy", random_tensor({1, 2, 12, 8}, 5, 1.0));
  std::ofstream(path("bad.npy")) << "not an array";
  const std::string fast = " --n 8 --d 4 --seeds 1 --projections iid ";
  expect_failure(fast + "--features 0", "--features");
  expect_failure(fast + "--features 8,0", "--features");
  expect_failure(fast + "--features 8,8", "--features");
  expect_failure(fast + "--features", "--features");
  expect_failure("--n 8 --d 4 --seeds 0 --projections iid", "--seeds");
  expect_failure(fast + "--estimators positive,softmax", "--estimators");
  expect_failure(fast + "--estimators ''", "--estimators");
  expect_failure("--n 8 --d 4 --projections iid,gaussian", "--projections");
  expect_failure(fast + "--kernel-pairs 0", "--kernel-pairs");
  expect_failure(fast + "--qk-norm 0", "--qk-norm");
  expect_failure(fast + "--qk-cos 1.5", "--qk-cos");
  expect_failure(fast + "--scale -1", "--scale");
  expect_failure("--n 0 --seeds 1 --projections iid", "--n");
  expect_failure("--dv 0 --n 8 --seeds 1 --projections iid", "--dv");
  const std::string files = " --seeds 1 --projections iid --features 4 ";
  expect_failure(files + "--q " + path("q.npy"), "--k");
  expect_failure(files + "--k " + path("k.npy"), "--q");
  expect_failure(files + "--q " + path("q.npy") + " --k " + path("k.npy") + " --n 4", "--n");
  expect_failure(files + "--q " + path("q.npy") + " --k " + path("k6.npy"), "--k");
  expect_failure(
      files + "--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v9.npy"), "--v");
  expect_failure(files + "--q " + path("bad.npy") + " --k " + path("k.npy"), "--q");
  expect_failure(files + "--q " + path("q.npy") + " --k " + path("missing.npy"), "--k");
  expect_failure(files + "--causal --q " + path("q.npy") + " --k " + path("k12.npy"), "--causal");
}

TEST_F(AccuracyCli, FileInputsMatchTheLibrary) {
  const Tensor q = random_tensor({1, 2, 40, 8}, 1, 1.0), k = random_tensor({1, 2, 40, 8}, 2, 1.0),
               v = random_tensor({1, 2, 40, 3}, 3);
  write("q.npy", q);
  write("k.npy", k);
  write("v.npy", v);
  const json result =
      run_json("--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
               " --estimators positive,favorpp --projections iid,orthogonal --features 8 "
               "--seeds 2 --kernel-pairs 16 --scale 0.5");
  const json& meta = result["meta"];
  EXPECT_EQ(meta["heads"], 2);
  EXPECT_EQ(meta["n"], 40);
  EXPECT_EQ(meta["d"], 8);
  EXPECT_EQ(meta["dv"], 3);
  EXPECT_EQ(meta["data"][0]["label"], "files");
  ASSERT_EQ(result["records"].size(), 4u);
  ExactOptions eo;
  eo.scale = 0.5;
  eo.accumulation = Accumulation::f64;
  const Tensor exact = exact_attention(q, k, v, eo);
  for (const json& r : result["records"]) {
    EXPECT_EQ(r["data"], "files");
    AttentionOptions o;
    o.kernel = parse_kernel(r["estimator"], "estimator");
    o.scale = 0.5;
    double mean = 0.0;
    for (uint64_t seed = 0; seed < 2; ++seed) {
      const Projection w = Projection::draw(
          8, 8, {parse_projection_kind(r["projection"], "projection"), NormMode::chi, seed});
      mean += relative_frobenius_error(favor_attention(q, k, v, w, o), exact) / 2.0;
    }
    EXPECT_NEAR(r["attention_rel_error"].get<double>(), mean, 1e-6 * mean) << r.dump();
  }
}

// --causal: every record is the library's causal favor_attention against causal exact
// attention with the same projection draws (FAVOR++ / FAVOR# given fit_kernel on the same q,
// k), and the bidirectional run's records are the bidirectional errors of the same draws,
// which differ: the flag reaches both the baseline and the estimate. Kernel MSEs are pairwise
// and do not change.
TEST_F(AccuracyCli, CausalFileInputsMatchTheLibrary) {
  write_qkv();
  const std::string args = qkv() +
                           " --estimators positive,favorpp,favorsharp --projections iid,orthogonal "
                           "--features 8 --seeds 2 --kernel-pairs 16 --scale 0.5";
  const json causal = run_json(args + " --causal"), bidirectional = run_json(args);
  EXPECT_EQ(causal["meta"]["causal"], true);
  EXPECT_EQ(bidirectional["meta"]["causal"], false);
  ASSERT_EQ(causal["records"].size(), 6u);
  ASSERT_EQ(bidirectional["records"].size(), 6u);
  std::vector<Tensor> exact;
  for (bool c : {false, true}) {
    ExactOptions eo;
    eo.causal = c;
    eo.scale = 0.5;
    eo.accumulation = Accumulation::f64;
    exact.push_back(exact_attention(q, k, v, eo));
  }
  for (size_t i = 0; i < 6; ++i) {
    const json &rc = causal["records"][i], &rb = bidirectional["records"][i];
    AttentionOptions o;
    o.kernel = parse_kernel(rc["estimator"], "estimator");
    o.scale = 0.5;
    if (data_adapted(o.kernel)) o.fit = fit_kernel(o.kernel, q, k, 0.5);
    double mean[2] = {0.0, 0.0};
    for (bool c : {false, true}) {
      o.causal = c;
      for (uint64_t seed = 0; seed < 2; ++seed) {
        const Projection w = Projection::draw(
            8, 8, {parse_projection_kind(rc["projection"], "projection"), NormMode::chi, seed});
        mean[c] += relative_frobenius_error(favor_attention(q, k, v, w, o), exact[c]) / 2.0;
      }
    }
    EXPECT_NEAR(rc["attention_rel_error"].get<double>(), mean[1], 1e-6 * mean[1]) << rc.dump();
    EXPECT_NEAR(rb["attention_rel_error"].get<double>(), mean[0], 1e-6 * mean[0]) << rb.dump();
    EXPECT_GT(std::abs(mean[1] - mean[0]), 1e-3 * mean[1]) << rc.dump();
    EXPECT_EQ(rc["kernel_mse"], rb["kernel_mse"]) << rc.dump();
  }
  const Result table = run(args + " --causal");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("attention (causal: query i sees keys j <= i)"), std::string::npos)
      << table.out;
}

// The maps section with --causal, on the held-out second half: the unfitted maps' errors are
// the library's causal ones (favor++ / favor# given fit_kernel on the evaluated q, k), the
// fitted maps train and are judged causally (fit_features with FitOptions::causal), and every
// error differs from the bidirectional run's.
TEST_F(AccuracyCli, CausalMapsSectionMatchesTheLibrary) {
  write_qkv();
  const std::string args =
      qkv() + " --sections maps --maps-features 8 --maps-steps 3 --seeds 2 --scale 0.5";
  const json causal = run_json(args + " --causal"), bidirectional = run_json(args);
  EXPECT_EQ(causal["meta"]["causal"], true);
  const json &records = causal["maps_records"], &other = bidirectional["maps_records"];
  ASSERT_EQ(records.size(), 7u);
  ASSERT_EQ(other.size(), 7u);
  const FitData train{testing::positions(q, 0, 20), testing::positions(k, 0, 20),
                      testing::positions(v, 0, 20), std::nullopt};
  const FitData held{testing::positions(q, 20, 20), testing::positions(k, 20, 20),
                     testing::positions(v, 20, 20), std::nullopt};
  ExactOptions eo;
  eo.causal = true;
  eo.scale = 0.5;
  eo.accumulation = Accumulation::f64;
  const Tensor exact = exact_attention(held.q, held.k, held.v, eo);
  AttentionOptions ao;
  ao.causal = true;
  // What each fitted method learns (accuracy_maps.cpp): weights, bias, lambda.
  const std::map<std::string, std::array<bool, 3>> learns{{"wpff", {false, false, true}},
                                                          {"positive-fit", {true, true, true}},
                                                          {"hedgehog", {true, true, false}}};
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    const Kernel kernel = parse_kernel(r["kernel"], "kernel");
    double mean = 0.0, initial = 0.0;
    for (uint64_t seed = 0; seed < 2; ++seed) {
      FeatureMap map(Projection::draw(r["m"].get<int64_t>(), 8,
                                      {parse_projection_kind(r["projection"], "projection"),
                                       NormMode::chi, seed}),
                     kernel);
      map.scale = 0.5;
      if (data_adapted(kernel)) map.fit = fit_kernel(kernel, held.q, held.k, 0.5);
      if (r["fitted"].get<bool>()) {
        const std::array<bool, 3> learn = learns.at(r["method"].get<std::string>());
        FitOptions fo;
        fo.steps = 3;
        fo.learning_rate = 0.02;
        fo.learn_weights = learn[0];
        fo.learn_bias = learn[1];
        fo.learn_lambda = learn[2];
        fo.eval_every = 0;
        fo.causal = true;
        FitResult fit = fit_features(train, held, map, fo);
        initial += fit.history.front().heldout_error / 2.0;
        map = std::move(fit.map);
      }
      mean +=
          relative_frobenius_error(favor_attention(held.q, held.k, held.v, map, ao), exact) / 2.0;
    }
    // Fitted maps: a few Adam steps amplify float rounding, which may differ with the threads.
    const double tol = r["fitted"].get<bool>() ? 1e-4 : 1e-6;
    EXPECT_NEAR(r["attention_rel_error"].get<double>(), mean, tol * mean) << r.dump();
    if (r["fitted"].get<bool>())
      EXPECT_NEAR(r["initial_rel_error"].get<double>(), initial, 1e-6 * initial) << r.dump();
    EXPECT_EQ(other[i]["method"], r["method"]);
    EXPECT_GT(std::abs(other[i]["attention_rel_error"].get<double>() - mean), 1e-3 * mean)
        << r.dump();
  }
}

TEST_F(AccuracyCli, TwoDimensionalFilesWithoutValues) {
  // Cross attention (Nq != Nk), rank-2 files, synthetic values of --dv columns.
  write("q.npy", random_tensor({1, 1, 30, 6}, 4, 1.0), true);
  write("k.npy", random_tensor({1, 1, 50, 6}, 5, 1.0), true);
  const json result = run_json("--q " + path("q.npy") + " --k " + path("k.npy") +
                               " --dv 5 --estimators trig --projections iid --features 4,8 "
                               "--seeds 2");
  const json& meta = result["meta"];
  EXPECT_EQ(meta["n"], 30);
  EXPECT_EQ(meta["nk"], 50);
  EXPECT_EQ(meta["dv"], 5);
  EXPECT_EQ(meta["kernel_pairs"], json({30, 50}));
  EXPECT_EQ(result["records"].size(), 2u);
}

TEST_F(AccuracyCli, PlotIsWrittenOrFailsCleanly) {
  const std::string args =
      "--n 32 --d 8 --dv 4 --features 4,8,16 --seeds 2 --estimators positive,trig,favorpp "
      "--projections iid,orthogonal --qk-norm 1,2";
  const Result r = run(args + " --plot " + path("acc.png") + " --out " + path("acc.json"));
  if (r.code != 0 && r.err.find("No module named 'matplotlib'") != std::string::npos)
    GTEST_SKIP() << "matplotlib is missing: " << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp("acc.png").substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_NO_THROW(json::parse(slurp("acc.json")));
  fs::remove(path("acc.png"));
  fs::remove(path("acc.json"));
  // A failing plot script: exit 2, one line, and neither the plot nor --out is written.
  expect_failure(args + " --plot " + path("acc.png"), "--plot", "FAVOR_PYTHON=/bin/false");
  EXPECT_FALSE(fs::exists(path("acc.png")));
}

}  // namespace
}  // namespace favor
