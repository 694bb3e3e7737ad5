// mpirun -np 3 favor attention --distributed (--method favor and vq): the output file equals
// the single-process command's to float tolerance; failures, on every rank or on one rank only,
// exit 2 on every rank with one error line and leave no file.
#include <cmath>

#include "cli_fixture.hpp"

namespace favor::testing {
namespace {

// Tolerance: as the MPI library tests (tests/distributed/mpi_fixture.hpp), the same sums in
// another order, relative to the largest magnitude of the output.
constexpr double kTolerance = 2e-4;

class CliDistributed : public CliTest {
 protected:
  // `favor args` under mpirun with 3 ranks of one thread each.
  Result run_mpi(const std::string& args) const {
    return run_cli(
        "attention --distributed " + args,
        std::string("OMP_NUM_THREADS=1 ") + "FAVOR_NUM_THREADS=1 " + FAVOR_MPIEXEC + " 3");
  }
  // The largest |a - b| over the largest |b|.
  static double error(const Tensor& a, const Tensor& b) {
    double diff = 0.0, top = 1e-30;
    for (int64_t i = 0; i < b.numel(); ++i) {
      diff = std::max(diff, std::abs(double(a.data()[i]) - b.data()[i]));
      top = std::max(top, std::abs(double(b.data()[i])));
    }
    return diff / top;
  }
  void expect_same_as_single_process(const std::string& args) {
    const Result one = run_cli("attention " + args + " --out " + path("y1.npy"));
    ASSERT_EQ(one.code, 0) << one.err;
    const Result three = run_mpi(args + " --out " + path("y3.npy"));
    ASSERT_EQ(three.code, 0) << args << "\n" << three.err;
    EXPECT_NE(three.out.find("3 ranks"), std::string::npos) << three.out;
    EXPECT_NE(three.out.find("bytes of states"), std::string::npos) << three.out;
    const Tensor y1 = read("y1.npy"), y3 = read("y3.npy");
    ASSERT_EQ(y1.shape(), y3.shape()) << args;
    EXPECT_LE(error(y3, y1), kTolerance) << args;
    // The same header: the file is one .npy of the single-process rank and shape.
    EXPECT_EQ(slurp("y1.npy").substr(0, 128), slurp("y3.npy").substr(0, 128)) << args;
  }
  // Exit 2, one error line from favor containing `fragment`, no output, no temporaries.
  void expect_failure(const std::string& args, const std::string& fragment) {
    expect_failed(run_mpi(args + " --out " + path("bad.npy")), args, {fragment});
  }
  // The same for a run `r` of `args`: every fragment in the one error line; no bad.npy and no
  // temporary in the test's folder nor in `other` (a rank's working directory).
  void expect_failed(const Result& r, const std::string& args,
                     const std::vector<std::string>& fragments,
                     const std::filesystem::path& other = {}) {
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    size_t lines = 0;
    for (size_t at = r.err.find("favor: error:"); at != std::string::npos;
         at = r.err.find("favor: error:", at + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << r.err;
    for (const std::string& fragment : fragments)
      EXPECT_NE(r.err.find(fragment), std::string::npos) << args << "\n" << r.err;
    for (const std::filesystem::path& folder : {dir, other}) {
      if (folder.empty()) continue;
      EXPECT_FALSE(std::filesystem::exists(folder / "bad.npy")) << folder;
      for (const auto& entry : std::filesystem::directory_iterator(folder))
        EXPECT_EQ(entry.path().string().find(".partial-"), std::string::npos) << entry.path();
    }
  }
};

TEST_F(CliDistributed, OutputEqualsSingleProcess) {
  write_qkv(40);  // slices of 13, 13, 14 rows
  std::vector<int64_t> mask_shape{2, 40};
  std::vector<uint8_t> mask(80);
  for (size_t j = 0; j < mask.size(); ++j) mask[j] = j % 7 != 2;
  write_bytes("m.npy", io::encode_npy("|b1", mask_shape, mask.data(), mask.size()));
  write("q25.npy", random_tensor({2, 3, 25, 8}, 4, 1.0));
  const std::vector<double> v64(v.values().begin(), v.values().end());  // float64 values
  write_bytes("v64.npy", io::encode_npy("<f8", {2, 3, 40, 5}, v64.data(), 8 * v64.size()));
  expect_same_as_single_process(qkv() + " --key-mask " + path("m.npy"));
  expect_same_as_single_process(qkv() + " --causal --decay 0.9,0.95,1 --kernel hyperbolic");
  expect_same_as_single_process(qkv() + " --kernel favorsharp --features 32");  // fit over ranks
  expect_same_as_single_process("--q " + path("q25.npy") + " --k " + path("k.npy") + " --v " +
                                path("v64.npy") + " --key-mask " + path("m.npy"));
  write("q2.npy", q, true);  // 2-D inputs [N, D]
  write("k2.npy", k, true);
  write("v2.npy", v, true);
  write_bytes("m2.npy", io::encode_npy("|b1", {40}, mask.data(), 40));  // [Nk]
  expect_same_as_single_process("--q " + path("q2.npy") + " --k " + path("k2.npy") + " --v " +
                                path("v2.npy") + " --causal --scale 0.5 --key-mask " +
                                path("m2.npy"));
}

TEST_F(CliDistributed, OutputEqualsSingleProcessVQ) {
  // Transformer-VQ: every rank reads the whole codebook; hard VQ needs keys without a near-tie
  // between their two nearest codes (the ranks' tiles of the keys round like the whole's then).
  write_qkv(40);
  const Tensor book = random_tensor({1, 3, 6, 8}, 8, 1.0),
               shared = random_tensor({1, 1, 6, 8}, 9, 1.0);
  ASSERT_EQ(vq_near_ties(k, book), 0);
  write_bytes("c.npy", io::encode_npy_f32({3, 6, 8}, book.data()));  // [H, c, D]
  write_bytes("c2.npy", io::encode_npy_f32({6, 8}, shared.data()));  // [c, D], every head
  std::vector<uint8_t> mask(80);
  for (size_t j = 0; j < mask.size(); ++j) mask[j] = j % 7 != 2;
  write_bytes("m.npy", io::encode_npy("|b1", {2, 40}, mask.data(), mask.size()));
  const std::string vq = qkv() + " --method vq --codebook ";
  expect_same_as_single_process(vq + path("c.npy") + " --causal --key-mask " + path("m.npy"));
  expect_same_as_single_process(vq + path("c2.npy") + " --vq-tau 0.5 --key-mask " + path("m.npy"));
  write("q2.npy", q, true);  // 2-D inputs [N, D], causal soft VQ with a block of 5
  write("k2.npy", k, true);
  write("v2.npy", v, true);
  expect_same_as_single_process("--q " + path("q2.npy") + " --k " + path("k2.npy") + " --v " +
                                path("v2.npy") + " --method vq --codebook " + path("c2.npy") +
                                " --causal --vq-tau 1 --vq-block 5 --codes 6");
  // --save-codebook: rank 0 writes the codebook used, as the single-process command does.
  const Result saved = run_mpi(vq + path("c.npy") + " --out " + path("y.npy") +
                               " --save-codebook " + path("saved.npy"));
  ASSERT_EQ(saved.code, 0) << saved.err;
  EXPECT_EQ(slurp("saved.npy"), slurp("c.npy"));
}

TEST_F(CliDistributed, ErrorsExitTwoOnEveryRankAndLeaveNoFile) {
  write_qkv(40);
  write("v30.npy", random_tensor({2, 3, 30, 5}, 5));
  write("k7.npy", random_tensor({2, 3, 40, 7}, 6));
  const std::string qk = "--q " + path("q.npy") + " --k " + path("k.npy");
  expect_failure(qk + " --v " + path("v30.npy"), "k and v must share N");
  expect_failure("--q " + path("q.npy") + " --k " + path("k7.npy") + " --v " + path("v.npy"),
                 "same head dim D");
  expect_failure(qk + " --v " + path("missing.npy"), "cannot open");
  expect_failure(qkv() + " --method exact", "only --method favor and vq");
  // vq: a codebook is required (no k-means over the slices), with the keys' D.
  expect_failure(qkv() + " --method vq --codes 4", "--distributed vq needs a codebook file");
  const Tensor book = random_tensor({1, 1, 4, 7}, 8);
  write_bytes("c7.npy", io::encode_npy_f32({4, 7}, book.data()));
  expect_failure(qkv() + " --method vq --codebook " + path("c7.npy"), "has D = 7");
  expect_failure(qkv() + " --method vq --codebook " + path("c7.npy") + " --decay 0.9",
                 "--decay: only --method favor takes it");
  const Result r = run_mpi(qkv() + " --out " + path("no/such/dir/y.npy"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot create output"), std::string::npos) << r.err;
}

TEST_F(CliDistributed, OneRankFailsEveryRankExitsTwo) {
  // Each rank reads only its rows (slices of 13, 13, 14 of N = 40), so only the rank whose rows
  // hold a bad value sees it; every rank must still exit 2, with one error line from rank 0
  // naming that rank and the value's position in the file (not in the rank's slice).
  write_qkv(40);
  Tensor bad_q = q;
  bad_q.data()[((1 * 3 + 2) * 40 + 35) * 8 + 3] = std::nanf("");  // [1,2,35,3]: rank 2's row 9
  write("bad_q.npy", bad_q);
  const std::string kv = " --k " + path("k.npy") + " --v " + path("v.npy");
  expect_failure("--q " + path("bad_q.npy") + kv, "--q: " + path("bad_q.npy") +
                                                      ": element [1,2,35,3] is nan; inputs must be "
                                                      "finite (no NaN or Inf) (rank 2 of 3)");
  Tensor bad_v = v;
  bad_v.data()[((0 * 3 + 1) * 40 + 20) * 5 + 4] = INFINITY;  // [0,1,20,4]: rank 1's row 7
  write("bad_v.npy", bad_v);
  expect_failure(
      "--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("bad_v.npy") + " --causal",
      "element [0,1,20,4] is inf; inputs must be finite (no NaN or Inf) (rank 1 of 3)");
  // float64 files: a finite value beyond float32's range is refused too, on rank 0.
  std::vector<double> v64(v.values().begin(), v.values().end());
  v64[2 * 5] = 1e300;  // [0,0,2,0]
  write_bytes("v64.npy", io::encode_npy("<f8", {2, 3, 40, 5}, v64.data(), 8 * v64.size()));
  expect_failure("--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v64.npy"),
                 "element [0,0,2,0] is 1e+300 (beyond float32's range); inputs must be finite "
                 "(no NaN or Inf) (rank 0 of 3)");
  // 2-D files [N, D]: the position is [n, x]; Transformer-VQ reads the same way.
  Tensor bad_q2({1, 1, 40, 8});
  std::copy_n(q.data(), 40 * 8, bad_q2.data());
  bad_q2.data()[30 * 8 + 6] = -INFINITY;  // [30,6]: rank 2's row 4
  write("bad_q2.npy", bad_q2, true);
  write("k2.npy", k, true);
  write("v2.npy", v, true);
  const Tensor book = random_tensor({1, 1, 4, 8}, 8);
  write_bytes("c.npy", io::encode_npy_f32({4, 8}, book.data()));
  expect_failure("--q " + path("bad_q2.npy") + " --k " + path("k2.npy") + " --v " + path("v2.npy") +
                     " --method vq --codebook " + path("c.npy"),
                 "element [30,6] is -inf; inputs must be finite (no NaN or Inf) (rank 2 of 3)");
}

TEST_F(CliDistributed, OneRankCannotOpenTheOutput) {
  // A node without the shared file system: rank 2 runs in another folder (mpiexec -wdir, one
  // app context per folder), so the relative --out names a file it does not have. Its open
  // fails and the others' succeed; every rank must exit 2 (none left inside a collective call),
  // with one error line, and rank 0 removes the temporary.
  write_qkv(40);
  const std::filesystem::path other = dir / "other";
  std::filesystem::create_directories(other);
  // Ranks 0 and 1 in the test's folder, rank 2 in `other`.
  const auto run_split = [&](const std::string& out) {
    const std::string favor =
        std::string(FAVOR_CLI_PATH) + " attention --distributed " + qkv() + " --out " + out;
    // A hang (ranks left inside a collective) fails in a minute rather than at ctest's limit.
    const bool limit = std::system("command -v timeout >/dev/null 2>&1") == 0;
    const std::string cmd = std::string("OMP_NUM_THREADS=1 FAVOR_NUM_THREADS=1 ") +
                            (limit ? "timeout -k 5 60 " : "") + FAVOR_MPIEXEC + " 2 -wdir " +
                            dir.string() + " " + favor + " : " + FAVOR_MPIEXEC_NUMPROC_FLAG +
                            " 1 -wdir " + other.string() + " " + favor + " >" + path("stdout.txt") +
                            " 2>" + path("stderr.txt");
    const int status = std::system(cmd.c_str());
    return Result{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp("stderr.txt"),
                  slurp("stdout.txt")};
  };
  expect_failed(run_split("bad.npy"), "--out bad.npy",
                {"--out: bad.npy.partial-", "MPI_File_open failed", "(rank 2 of 3)",
                 "a file system that every rank sees"},
                other);
  // The same layout writes the file when every rank sees it (an absolute --out).
  const Result good = run_split(path("y.npy"));
  ASSERT_EQ(good.code, 0) << good.err;
  const Result one = run_cli("attention " + qkv() + " --out " + path("y1.npy"));
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_LE(error(read("y.npy"), read("y1.npy")), kTolerance);
}

}  // namespace
}  // namespace favor::testing
