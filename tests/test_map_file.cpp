// The feature-map file (src/io/map_file.hpp) and the .npz container under it (src/io/npz.hpp):
// maps round-trip bit for bit; the reader takes what numpy writes (np.savez_compressed:
// deflate, zip64 extra fields); every truncated or corrupted file throws favor::Error
// naming the file (never another exception, never a crash); the members are checked.
// Rerun one with build/tests/favor_tests --gtest_filter='MapFile.<Name>'
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "map_file.hpp"
#include "npy.hpp"
#include "npz.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
namespace fs = std::filesystem;
using testing::expect_error;
using testing::random_tensor;

// np.savez_compressed(kernel=np.array('hedgehog', dtype='<U16'), scale=np.float64(0.5),
//   projection=[[1, 2, 3], [4, 5, 6]], heads=np.int64(1), weights=[[[1, 0, 0], [0, 1, 0]]],
//   bias=[[0.5, -0.5]], lambda=[[1, 2]]) (float32 arrays), numpy 1.24.
const char* const kNumpyDeflated =
    "504b030414000000080000002100f9f3a80855000000c00000000a0014006b65726e656c2e6e707901001000c00000"
    "00"
    "0000000055000000000000009bec17ea1b10c9c850c650ad9e925a9c5ca46ea5a06e136a68a6aea3a09e965f545294"
    "98"
    "179f5f94920a92704bcc294e058a17672416a402f91a9a3a0ab50a9400ae0c06068654204e01e274281b24960fe513"
    "02"
    "00504b03041400000008000000210070ee92694700000088000000090014007363616c652e6e707901001000880000"
    "00"
    "0000000047000000000000009bec17ea1b10c9c850c650ad9e925a9c5ca46ea5a06e9366a1aea3a09e965f54529498"
    "17"
    "9f5f94920a12774bcc294e058a17672416a402f91a9a3a0ab50a14012e063078600f00504b03041400000008000000"
    "21"
    "007c9cdea258000000980000000e00140070726f6a656374696f6e2e6e707901001000980000000000000058000000"
    "00"
    "0000009bec17ea1b10c9c850c650ad9e925a9c5ca46ea5a06e9366a2aea3a09e965f54529498179f5f94920a12774b"
    "cc"
    "294e058a17672416a402f91a463a0ac69a3a0ab50a64032e0686067b060606072002e206205e00c4071c00504b0304"
    "14"
    "000000080000002100a4b19faa46000000880000000900140068656164732e6e707901001000880000000000000046"
    "00"
    "0000000000009bec17ea1b10c9c850c650ad9e925a9c5ca46ea5a06e9369a1aea3a09e965f54529498179f5f94920a"
    "12"
    "774bcc294e058a17672416a402f91a9a3a0ab50a14012e4606080000504b030414000000080000002100c4e4befb52"
    "00"
    "0000980000000b001400776569676874732e6e707901001000980000000000000052000000000000009bec17ea1b10"
    "c9"
    "c850c650ad9e925a9c5ca46ea5a06e9366a2aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a4"
    "02"
    "f91a863a0a463a0ac69a3a0ab50ae4012e0686067b061400e10300504b030414000000080000002100e4bdf7d94d00"
    "00"
    "008800000008001400626961732e6e70790100100088000000000000004d000000000000009bec17ea1b10c9c850c6"
    "50"
    "ad9e925a9c5ca46ea5a06e9366a2aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a402f91a86"
    "3a"
    "0a469a3a0ab50a64032e0606067b20de0f00504b030414000000080000002100b14645ea4e000000880000000a0014"
    "00"
    "6c616d6264612e6e70790100100088000000000000004e000000000000009bec17ea1b10c9c850c650ad9e925a9c5c"
    "a4"
    "6ea5a06e9366a2aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a402f91a863a0a469a3a0ab5"
    "0a"
    "64032e0686067b0606060700504b0102140314000000080000002100f9f3a80855000000c00000000a000000000000"
    "00"
    "000000008001000000006b65726e656c2e6e7079504b010214031400000008000000210070ee926947000000880000"
    "00"
    "0900000000000000000000008001910000007363616c652e6e7079504b01021403140000000800000021007c9cdea2"
    "58"
    "000000980000000e000000000000000000000080011301000070726f6a656374696f6e2e6e7079504b010214031400"
    "00"
    "00080000002100a4b19faa46000000880000000900000000000000000000008001ab01000068656164732e6e707950"
    "4b"
    "0102140314000000080000002100c4e4befb52000000980000000b000000000000000000000080012c020000776569"
    "67"
    "6874732e6e7079504b0102140314000000080000002100e4bdf7d94d00000088000000080000000000000000000000"
    "80"
    "01bb020000626961732e6e7079504b0102140314000000080000002100b14645ea4e000000880000000a0000000000"
    "00"
    "00000000008001420300006c616d6264612e6e7079504b0506000000000700070089010000cc0300000000";

std::string unhex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return bytes;
}

class MapFile : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("favor_map_file_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

FeatureMap learned_map() {
  FeatureMap map(Projection::draw(5, 3, {ProjectionKind::orthogonal, NormMode::chi, 4}),
                 Kernel::hedgehog);
  map.learnable(2);
  const Tensor noise = random_tensor({1, 1, 1, 2 * 5 * 3 + 2 * 5 + 2 * 5}, 8);
  size_t i = 0;
  for (float& x : map.weights) x += noise.values()[i++];
  for (float& x : map.bias) x = noise.values()[i++];
  for (float& x : map.lambda) x = 1.0f + 0.5f * noise.values()[i++];
  map.scale = 0.3;
  return map;
}

void expect_same_map(const FeatureMap& a, const FeatureMap& b) {
  EXPECT_EQ(a.kernel, b.kernel);
  EXPECT_EQ(a.projection.matrix(), b.projection.matrix());
  EXPECT_EQ(a.m(), b.m());
  EXPECT_EQ(a.d(), b.d());
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.bias, b.bias);
  EXPECT_EQ(a.lambda, b.lambda);
}

// Every member bit for bit; optional members absent stay absent; the scale is resolved.
TEST_F(MapFile, RoundTripsEveryMember) {
  const FeatureMap map = learned_map();
  expect_same_map(io::read_map_file(write("m.npz", io::encode_map_file(map)), "--feature-map"),
                  map);
  for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::hyperbolic}) {
    FeatureMap plain(Projection::draw(4, 9), kernel);
    const FeatureMap back =
        io::read_map_file(write("p.npz", io::encode_map_file(plain)), "--feature-map");
    plain.scale = 1.0 / 3.0;  // written resolved: 1/sqrt(9)
    expect_same_map(back, plain);
    EXPECT_FALSE(back.learned());
  }
  expect_error([] { io::encode_map_file(FeatureMap(Projection::draw(4, 3), Kernel::favorpp)); },
               "favorpp map is defined by its fit");
}

// What numpy writes: deflated members with zip64 extra fields in their local headers.
TEST_F(MapFile, ReadsNumpySavezCompressed) {
  const FeatureMap map =
      io::read_map_file(write("np.npz", unhex(kNumpyDeflated)), "--feature-map");
  EXPECT_EQ(map.kernel, Kernel::hedgehog);
  EXPECT_EQ(map.scale, 0.5);
  EXPECT_EQ(map.heads, 1);
  EXPECT_EQ(map.projection.matrix(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(map.weights, (std::vector<float>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(map.bias, (std::vector<float>{0.5f, -0.5f}));
  EXPECT_EQ(map.lambda, (std::vector<float>{1, 2}));
}

// Every prefix of a file, and every single corrupted byte, gives favor::Error naming the file
// (or, for a byte no check covers, such as a version field, a valid map); nothing else.
TEST_F(MapFile, MalformedFilesThrowNamingTheFile) {
  const std::string p = (dir / "m.npz").string();
  for (const std::string& bytes : {io::encode_map_file(learned_map()), unhex(kNumpyDeflated)}) {
    for (size_t n = 0; n < bytes.size(); ++n) {
      expect_error([&] { io::decode_map_file(bytes.substr(0, n), p, "--feature-map"); },
                   "--feature-map: " + p);
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ 0x5a);
      try {
        io::decode_map_file(bad, p, "--feature-map");
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--feature-map: " + p), std::string::npos) << e.what();
      }
    }
  }
  std::string crc = io::encode_map_file(learned_map());
  crc[200] = static_cast<char>(crc[200] ^ 1);  // inside the first member's data
  const std::string file = write("crc.npz", crc);
  expect_error([&] { io::read_map_file(file, "--feature-map"); },
               "--feature-map: " + file +
                   ": not a valid .npz archive: CRC-32 mismatch in member 'kernel.npy'");
  expect_error([&] { io::read_map_file((dir / "missing.npz").string(), "--feature-map"); },
               "cannot open");
}

// The members: each missing, of the wrong dtype or shape, or with a bad value.
TEST_F(MapFile, ChecksTheMembers) {
  const FeatureMap map = learned_map();
  const std::vector<float>& w = map.projection.matrix();
  auto file = [&](std::vector<io::NpzMember> members) {
    return write("m.npz", io::encode_npz(members));
  };
  const io::NpzMember kernel{"kernel", io::encode_npy_unicode("hedgehog", 16)},
      scale{"scale", io::encode_npy_f64_scalar(0.3)},
      projection{"projection", io::encode_npy_f32({5, 3}, w.data())},
      heads{"heads", io::encode_npy_i64_scalar(2)};
  auto expect_bad = [&](std::vector<io::NpzMember> members, const std::string& fragment) {
    const std::string p = file(members);
    expect_error([&] { io::read_map_file(p, "--feature-map"); }, "--feature-map: " + p);
    expect_error([&] { io::read_map_file(p, "--feature-map"); }, fragment);
  };
  EXPECT_FALSE(io::read_map_file(file({kernel, scale, projection, heads}), "m").learned());
  expect_bad({scale, projection, heads}, "no member 'kernel'");
  expect_bad({kernel, projection, heads}, "no member 'scale'");
  expect_bad({kernel, scale, heads}, "no member 'projection'");
  expect_bad({kernel, scale, projection}, "no member 'heads'");
  expect_bad({{"kernel", io::encode_npy_unicode("favorpp", 16)}, scale, projection, heads},
             "kernel favorpp needs its fit");
  expect_bad({{"kernel", io::encode_npy_unicode("cosine", 16)}, scale, projection, heads},
             "member 'kernel' is 'cosine'");
  expect_bad({{"kernel", io::encode_npy_f64_scalar(1.0)}, scale, projection, heads}, "'<U')");
  expect_bad({kernel, {"scale", io::encode_npy_f64_scalar(-1.0)}, projection, heads},
             "member 'scale' is -1");
  expect_bad({kernel, scale, projection, {"heads", io::encode_npy_i64_scalar(0)}},
             "member 'heads' is 0");
  expect_bad({kernel, scale, {"projection", io::encode_npy_f32({15}, w.data())}, heads},
             "must be 2-D [m, d]");
  expect_bad({kernel,
              scale,
              projection,
              heads,
              {"weights", io::encode_npy_f32({2, 3, 5}, map.weights.data())}},
             "member 'weights' has shape [2, 3, 5]; [heads, m, d] = [2, 5, 3] expected");
  expect_bad(
      {kernel, scale, projection, heads, {"bias", io::encode_npy_f32({1, 5}, map.bias.data())}},
      "member 'bias' has shape [1, 5]");
  std::vector<float> zero = map.lambda;
  zero[3] = 0.0f;
  expect_bad(
      {kernel, scale, projection, heads, {"lambda", io::encode_npy_f32({2, 5}, zero.data())}},
      "map.lambda[3]");
  expect_bad({kernel, scale, projection, heads, heads}, "member 'heads.npy' appears twice");
}

// Integer and unicode scalars: sign extension, NUL padding, non-ASCII refused.
TEST(Npy, ScalarsAndUnicode) {
  const int32_t minus = -7;
  EXPECT_EQ(io::decode_int_scalar_npy(io::encode_npy("<i4", {}, &minus, 4), "x", "a"), -7);
  const uint16_t big = 65535;
  EXPECT_EQ(io::decode_int_scalar_npy(io::encode_npy("<u2", {1}, &big, 2), "x", "a"), 65535);
  EXPECT_EQ(io::decode_float_scalar_npy(io::encode_npy_f64_scalar(0.1), "x", "a"), 0.1);
  EXPECT_EQ(io::decode_unicode_npy(io::encode_npy_unicode("trig", 16), "x", "a"), "trig");
  expect_error([] { io::encode_npy_unicode(std::string(17, 'a'), 16); }, "longer than 16");
  const uint32_t accent[2] = {0x68, 0xe9};
  expect_error([&] { io::decode_unicode_npy(io::encode_npy("<U2", {}, accent, 8), "x", "a"); },
               "a: x: holds a character outside printable ASCII");
  const double two[2] = {1, 2};
  expect_error(
      [&] { io::decode_float_scalar_npy(io::encode_npy("<f8", {2}, two, 16), "x", "a"); },
      "must hold one value");
}

}  // namespace
}  // namespace favor
