#pragma once
// A per-test temporary folder and the favor CLI run as a process (stdout and stderr
// captured): the base of the CLI test suites.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "favor/favor.hpp"
#include "npy.hpp"
#include "test_helpers.hpp"

namespace favor::testing {

class CliTest : public ::testing::Test {
 protected:
  std::filesystem::path dir;
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("favor_cli_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string path(const std::string& name) const { return (dir / name).string(); }

  void write_bytes(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  void write(const std::string& name, const Tensor& t, bool rank2 = false) const {
    const auto& s = t.shape();
    const std::vector<int64_t> shape =
        rank2 ? std::vector<int64_t>{s[2], s[3]} : std::vector<int64_t>{s[0], s[1], s[2], s[3]};
    write_bytes(name, io::encode_npy_f32(shape, t.data()));
  }
  Tensor read(const std::string& name) const {
    io::NpyArray a = io::read_float_npy(path(name), "test");
    Shape4 s = a.shape.size() == 2 ? Shape4{1, 1, a.shape[0], a.shape[1]}
                                   : Shape4{a.shape[0], a.shape[1], a.shape[2], a.shape[3]};
    return Tensor(s, a.values);
  }
  std::string slurp(const std::string& name) const {
    std::ifstream in(path(name));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  struct Result {
    int code;
    std::string err, out;
  };
  /// Runs `favor args` (with `env` assignments before it, if any).
  Result run_cli(const std::string& args, const std::string& env = "") const {
    const std::string cmd = env + " " + std::string(FAVOR_CLI_PATH) + " " + args + " >" +
                            path("stdout.txt") + " 2>" + path("stderr.txt");
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp("stderr.txt"), slurp("stdout.txt")};
  }

  /// Exit code 2, exactly one line on stderr containing `fragment`, no file at `out` other
  /// than what was there before (left unchanged), and no temporaries.
  void expect_failure(const std::string& args, const std::string& fragment,
                      const std::string& out = "y.npy") {
    const bool existed = std::filesystem::exists(path(out));
    const std::string before = existed ? slurp(out) : "";
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(std::filesystem::exists(path(out)), existed) << args;
    if (existed) EXPECT_EQ(slurp(out), before);
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      EXPECT_EQ(entry.path().string().find(".partial-"), std::string::npos) << entry.path();
    }
  }

  /// q, k, v [2, 3, n, 8 / 8 / 5] written as q.npy, k.npy, v.npy, and the options naming them.
  std::string qkv() const {
    return "--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy");
  }
  void write_qkv(int64_t n = 40) {
    q = random_tensor({2, 3, n, 8}, 1, 1.0);
    k = random_tensor({2, 3, n, 8}, 2, 1.0);
    v = random_tensor({2, 3, n, 5}, 3);
    write("q.npy", q);
    write("k.npy", k);
    write("v.npy", v);
  }
  Tensor q, k, v;
};

/// Positions [from, from + count) of a [B, H, N, X] tensor, as a view (the halves the
/// accuracy command's vq and maps sections fit on and evaluate).
inline TensorView positions(const Tensor& t, int64_t from, int64_t count) {
  const TensorView all = t.view();
  return TensorView{all.data + from * all.strides[2],
                    {all.shape[0], all.shape[1], count, all.shape[3]},
                    all.strides};
}

}  // namespace favor::testing
