// `favor fit` and the learned-map options of `favor attention`, run as a process: fit writes
// the map favor::fit_features fits (the held-out split, the options), attention
// --feature-map uses it exactly as favor_attention does, --feature-weights and --decay equal
// the library's, and every failure exits 2 with one line and no file.
// Rerun one with build/tests/favor_tests --gtest_filter='FitCli.<Name>'
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_fixture.hpp"
#include "map_file.hpp"
#include "npy.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using nlohmann::json;
using testing::random_tensor;

class FitCli : public testing::CliTest {
 protected:
  // q, k, v [4, 3, 40, 8 / 8 / 5]: four sequences, so that --holdout 0.25 keeps three.
  void write_batch4() {
    q = random_tensor({4, 3, 40, 8}, 1, 2.0);
    k = random_tensor({4, 3, 40, 8}, 2, 2.0);
    v = random_tensor({4, 3, 40, 5}, 3);
    write("q.npy", q);
    write("k.npy", k);
    write("v.npy", v);
  }
  static TensorView batches(const Tensor& t, int64_t from, int64_t count) {
    const Shape4& s = t.shape();
    return TensorView::contiguous(t.data() + from * s[1] * s[2] * s[3], {count, s[1], s[2], s[3]});
  }
  std::vector<std::string> lines(const std::string& text) const {
    std::vector<std::string> out;
    std::stringstream ss(text);
    for (std::string line; std::getline(ss, line);) out.push_back(line);
    return out;
  }
};

// The map fit writes is fit_features' on the same split (the last quarter of the batch held
// out) with the same start (--m, --seed) and options; stdout has one line per evaluated step
// and the summary; attention --feature-map with it equals favor_attention with the loaded map.
TEST_F(FitCli, FitWritesTheLibrarysMapAndAttentionUsesIt) {
  write_batch4();
  for (bool causal : {false, true}) {
    const std::string args =
        "fit " + qkv() + " --out " + path("map.npz") +
        " --m 6 --seed 4 --steps 6 --lr 0.03 --eval-every 2 --learn weights,bias" +
        (causal ? " --causal" : "");
    const Result r = run_cli(args);
    ASSERT_EQ(r.code, 0) << args << "\n" << r.err;
    const std::vector<std::string> out = lines(r.out);
    ASSERT_EQ(out.size(), 6u) << r.out;  // the header, steps 0, 2, 4, 6, the summary
    EXPECT_EQ(out[1].rfind("step     0  loss ", 0), 0u) << out[1];
    EXPECT_EQ(out[4].rfind("step     6  loss ", 0), 0u) << out[4];
    EXPECT_EQ(out[5].rfind("held-out error: ", 0), 0u) << out[5];

    FitOptions o;
    o.steps = 6;
    o.learning_rate = 0.03;
    o.eval_every = 2;
    o.causal = causal;
    o.learn_lambda = false;
    const FeatureMap start(Projection::draw(6, 8, {ProjectionKind::orthogonal, NormMode::chi, 4}),
                           Kernel::hedgehog);
    const FitResult expected = fit_features(
        {batches(q, 0, 3), batches(k, 0, 3), batches(v, 0, 3), std::nullopt},
        {batches(q, 3, 1), batches(k, 3, 1), batches(v, 3, 1), std::nullopt}, start, o);
    const FeatureMap map = io::read_map_file(path("map.npz"), "test");
    EXPECT_EQ(map.kernel, Kernel::hedgehog);
    EXPECT_EQ(map.heads, 3);
    EXPECT_EQ(map.scale, 1.0 / std::sqrt(8.0));
    EXPECT_EQ(map.projection.matrix(), start.projection.matrix());
    EXPECT_EQ(map.weights, expected.map.weights);
    EXPECT_EQ(map.bias, expected.map.bias);
    EXPECT_TRUE(map.lambda.empty());

    const std::string attention = "attention " + qkv() + " --out " + path("y.npy") +
                                  " --feature-map " + path("map.npz") + (causal ? " --causal" : "");
    const Result a = run_cli(attention);
    ASSERT_EQ(a.code, 0) << attention << "\n" << a.err;
    AttentionOptions ao;
    ao.causal = causal;
    EXPECT_EQ(read("y.npy").values(), favor_attention(q, k, v, map, ao).values()) << attention;
  }
}

// --json: the history and summary as one object; --heldout-* files instead of --holdout;
// 2-D inputs; --learn lambda creates lambda only (the map file has no weights or bias).
TEST_F(FitCli, JsonHeldoutFilesAndTwoDimensionalInputs) {
  const Tensor q2 = random_tensor({1, 1, 30, 6}, 4, 2.0), k2 = random_tensor({1, 1, 30, 6}, 5, 2.0),
               v2 = random_tensor({1, 1, 30, 3}, 6);
  write("q.npy", q2, true);
  write("k.npy", k2, true);
  write("v.npy", v2, true);
  write("hq.npy", random_tensor({1, 1, 20, 6}, 7, 2.0), true);
  write("hk.npy", random_tensor({1, 1, 20, 6}, 8, 2.0), true);
  write("hv.npy", random_tensor({1, 1, 20, 3}, 9), true);
  const std::string held = " --heldout-q " + path("hq.npy") + " --heldout-k " + path("hk.npy") +
                           " --heldout-v " + path("hv.npy");
  const Result r = run_cli("fit " + qkv() + held + " --out " + path("map.npz") +
                           " --kernel positive --m 4 --steps 3 --learn lambda --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["history"].size(), 4u);
  EXPECT_EQ(j["history"][3]["step"], 3);
  EXPECT_EQ(j["kernel"], "positive");
  EXPECT_DOUBLE_EQ(j["ratio"].get<double>(), j["final_heldout_error"].get<double>() /
                                                 j["initial_heldout_error"].get<double>());
  const FeatureMap map = io::read_map_file(path("map.npz"), "test");
  EXPECT_EQ(map.kernel, Kernel::positive);
  EXPECT_EQ(map.heads, 1);
  EXPECT_TRUE(map.weights.empty() && map.bias.empty());
  EXPECT_EQ(map.lambda.size(), 4u);
}

// --feature-weights ([m] and [H, m]) and --decay (1 or H values, causal) equal favor_attention
// with map.lambda and options.decay.
TEST_F(FitCli, FeatureWeightsAndDecayEqualTheLibrary) {
  write_qkv();
  const Projection w = Projection::draw(7, 8, {ProjectionKind::orthogonal, NormMode::chi, 2});
  const Tensor lambda = random_tensor({1, 1, 3, 7}, 11);
  std::vector<float> shared(lambda.values().begin(), lambda.values().begin() + 7);
  write_bytes("w1.npy", io::encode_npy_f32({7}, shared.data()));
  write_bytes("w3.npy", io::encode_npy_f32({3, 7}, lambda.data()));
  for (const auto& [file, sets] : {std::pair{"w1.npy", 1}, std::pair{"w3.npy", 3}})
    for (const std::string& decay : {"", "0.9", "0.9,0.8,1"}) {
      const bool causal = !decay.empty();
      const std::string args = "attention " + qkv() + " --out " + path("y.npy") +
                               " --features 7 --seed 2 --kernel hyperbolic --feature-weights " +
                               path(file) + (causal ? " --causal --decay " + decay : "");
      const Result r = run_cli(args);
      ASSERT_EQ(r.code, 0) << args << "\n" << r.err;
      FeatureMap map(w, Kernel::hyperbolic);
      map.heads = sets;
      map.lambda = sets == 1 ? shared : lambda.values();
      AttentionOptions o;
      o.causal = causal;
      if (decay == "0.9") o.decay = {0.9};
      if (decay == "0.9,0.8,1") o.decay = {0.9, 0.8, 1.0};
      EXPECT_EQ(read("y.npy").values(), favor_attention(q, k, v, map, o).values()) << args;
    }
}

TEST_F(FitCli, FitFailuresExitTwoAndLeaveNoFile) {
  write_batch4();
  const std::string fit = "fit " + qkv() + " --out " + path("map.npz");
  expect_failure(fit + " --kernel favorpp", "--kernel: favorpp takes its parameters", "map.npz");
  expect_failure(fit + " --kernel cosine", "--kernel", "map.npz");
  expect_failure(fit + " --learn weights,gamma", "--learn: 'gamma' is not a parameter", "map.npz");
  expect_failure(fit + " --learn ,", "--learn: ',' names nothing", "map.npz");
  expect_failure(fit + " --steps -1", "--steps: -1 must be >= 0", "map.npz");
  expect_failure(fit + " --lr 0", "--lr: 0 must be finite and > 0", "map.npz");
  expect_failure(fit + " --holdout 1", "--holdout: 1 must lie in (0, 1)", "map.npz");
  expect_failure(fit + " --heldout-q " + path("q.npy"), "give all three or none", "map.npz");
  expect_failure(fit + " --holdout 0.5 --heldout-q " + path("q.npy") + " --heldout-k " +
                     path("k.npy") + " --heldout-v " + path("v.npy"),
                 "not both", "map.npz");
  // Adam steps so large that the weights leave float: the fit fails at step 1, no file.
  expect_failure(fit + " --lr 1e300", "step 1: the update made weights non-finite", "map.npz");
  expect_failure(fit + " --m 0", "--features: 0 must be >= 1", "map.npz");
  expect_failure(fit + " --eval-every -2", "--eval-every: -2 must be >= 0", "map.npz");
  expect_failure("fit " + qkv() + " --out " + path("no/such/dir/map.npz"), "--out", "map.npz");
  // One sequence: nothing to hold out.
  write("q1.npy", random_tensor({1, 3, 40, 8}, 1));
  expect_failure("fit --q " + path("q1.npy") + " --k " + path("q1.npy") + " --v " + path("q1.npy") +
                     " --out " + path("map.npz"),
                 "--holdout: needs a batch of B >= 2 sequences", "map.npz");
  // An existing map is left as it was.
  write_bytes("map.npz", "old");
  expect_failure(fit + " --lr 1e300", "step 1", "map.npz");
}

TEST_F(FitCli, AttentionMapOptionFailuresExitTwo) {
  write_qkv();
  ASSERT_EQ(run_cli("fit " + qkv() + " --out " + path("map.npz") + " --m 4 --steps 1").code, 0);
  const std::string base = "attention " + qkv() + " --out " + path("y.npy");
  const std::string with_map = base + " --feature-map " + path("map.npz");
  for (const std::string& extra : {"--kernel positive", "--features 4", "--projection iid",
                                   "--seed 1", "--scale 0.5", "--fit-a 0.01"}) {
    expect_failure(with_map + " " + extra, "--feature-map: the map file gives the kernel");
  }
  expect_failure(with_map + " --method exact", "--feature-map: only --method favor takes it");
  expect_failure(base + " --decay 0.9", "--decay: decay gamma^(i - j) is for causal attention");
  expect_failure(base + " --causal --decay 0.9,0.8", "--decay: 2 values; give 1 or one per head");
  expect_failure(base + " --causal --decay 1.5", "--decay: 1.5 must lie in (0, 1]");
  expect_failure(base + " --method exact --causal --decay 0.9", "--decay: only --method favor");
  write_bytes("w.npy", io::encode_npy_f32({5}, std::vector<float>(5, 1.0f).data()));
  expect_failure(base + " --features 4 --feature-weights " + path("w.npy"),
                 "has shape [5]; [m] = [4] or [H, m] = [3, 4] expected");
  write_bytes("w0.npy", io::encode_npy_f32({4}, std::vector<float>(4, 0.0f).data()));
  expect_failure(base + " --features 4 --feature-weights " + path("w0.npy"), "finite and nonzero");
  expect_failure(base + " --kernel favorpp --features 4 --feature-weights " + path("w.npy"),
                 "--feature-weights: a favorpp map takes its weights from its fit");
  // A map for another head dim, a corrupt map file.
  write("q4.npy", random_tensor({2, 3, 40, 4}, 1));
  expect_failure("attention --q " + path("q4.npy") + " --k " + path("q4.npy") + " --v " +
                     path("v.npy") + " --out " + path("y.npy") + " --feature-map " +
                     path("map.npz"),
                 "its projection is 4 x 8 but the inputs have D = 4");
  write_bytes("bad.npz", "PK not really");
  expect_failure(base + " --feature-map " + path("bad.npz"), "not a valid .npz archive");
}

}  // namespace
}  // namespace favor
