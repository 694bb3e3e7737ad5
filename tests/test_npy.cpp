// The .npy reader of the CLI: the header grammar numpy writes (and its variants), every
// dtype and byte order converted exactly, Fortran order, arrays used in place in their
// mapping, the limits checked before any allocation, and messages that quote a file's bytes
// escaped.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "alloc_tracker.hpp"
#include "favor/error.hpp"
#include "npy.hpp"
#include "printable.hpp"

namespace favor {
namespace {
namespace fs = std::filesystem;

// A .npy file with the header dict `dict` (padded) and `data` after it; version 1 or 2.
std::string npy(std::string dict, const std::string& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string out = std::string("\x93NUMPY", 6) + char(version) + '\0';
  out += char(dict.size() & 0xff);
  out += char((dict.size() >> 8) & 0xff);
  if (version != 1) out += std::string("\0\0", 2);
  return out + dict + data;
}

std::string dict_of(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

template <class T>
std::string bytes_of(const std::vector<T>& v, bool big_endian = false) {
  std::string out;
  for (T x : v) {
    char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    if (big_endian) std::reverse(b, b + sizeof(T));
    out.append(b, sizeof(T));
  }
  return out;
}

// The message of the favor::Error that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string decode_error(const std::string& bytes) {
  return error_of([&] { io::decode_float_npy(bytes, "f.npy", "--q"); });
}

class NpyFile : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("favor_npy_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

TEST(Npy, HeaderVariantsNumpyWritesAreRead) {
  const std::string data = bytes_of<float>({1, 2, 3, 4, 5, 6});
  for (const std::string& dict :
       {dict_of("<f4", "(2, 3)"),
        std::string("{'descr':'<f4','fortran_order':False,'shape':(2,3)}"),
        std::string("{\"descr\": \"<f4\", \"shape\": (2L, 3L), \"fortran_order\": False}"),
        std::string("{ 'shape' : ( 2 , 3 , ) , 'fortran_order' : False , 'descr' : '<f4' , }")}) {
    for (int version : {1, 2, 3}) {
      const io::NpyArray a = io::decode_float_npy(npy(dict, data, version), "f.npy", "--q");
      EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3})) << dict;
      EXPECT_EQ(a.values, (std::vector<float>{1, 2, 3, 4, 5, 6})) << dict;
    }
  }
  // 0-d and 1-d shapes.
  EXPECT_EQ(
      io::decode_float_scalar_npy(npy(dict_of("<f8", "()"), bytes_of<double>({2.5})), "s", "--a"),
      2.5);
  EXPECT_EQ(
      io::decode_float_npy(npy(dict_of("<f4", "(3,)"), bytes_of<float>({1, 2, 3})), "f", "--q")
          .shape,
      (std::vector<int64_t>{3}));
}

TEST(Npy, MalformedHeadersNameTheRule) {
  const std::string data = bytes_of<float>({1, 2});
  const std::pair<std::string, std::string> cases[] = {
      {"{'descr': '<f4', 'fortran_order': False}", "has no 'shape'"},
      {"{'descr': '<f4', 'shape': (2,)}", "has no 'fortran_order'"},
      {"{'fortran_order': False, 'shape': (2,)}", "has no 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
       "unknown key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "repeats"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured dtype"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "',' or '}' after a value"},
      {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", "expected True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}", "expected a dimension"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", "only blanks"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,", "expected a dimension"},
      {"{'descr': 'float', 'fortran_order': False, 'shape': (2,)}", "not a plain numeric dtype"},
      {"{'descr': '<f3', 'fortran_order': False, 'shape': (2,)}", "'<f3' is not supported"},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", "'<i4' is not supported"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 2)}", "no elements"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", "truncated: 12 bytes"},
  };
  for (const auto& [dict, rule] : cases) {
    const std::string message = decode_error(npy(dict, data));
    EXPECT_NE(message.find(rule), std::string::npos) << dict << "\n" << message;
    EXPECT_EQ(message.rfind("--q: f.npy: ", 0), 0u) << message;
  }
  std::string version = npy(dict_of("<f4", "(2,)"), data);
  version[6] = 4;
  EXPECT_NE(decode_error(version).find("unsupported .npy format version 4.0"), std::string::npos);
  version[6] = 1;
  version[7] = 1;
  EXPECT_NE(decode_error(version).find("version 1.1"), std::string::npos);
  EXPECT_NE(decode_error(npy(dict_of("<f4", "(2,)"), data).substr(0, 30)).find("truncated header"),
            std::string::npos);
  EXPECT_NE(decode_error("").find("empty"), std::string::npos);
}

TEST(Npy, EveryFloatDtypeAndByteOrderConvertsExactly) {
  // Values exact in float16: normal, subnormal (2^-24, 3 * 2^-20), signed zero, Inf.
  const std::vector<double> values{1.5, -2.25, 0x1p-24, 3 * 0x1p-20, -0.0, 65504.0, INFINITY};
  const auto expect_values = [&](const io::NpyArray& a, const std::string& what) {
    ASSERT_EQ(a.values.size(), values.size()) << what;
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(a.values[i]),
                std::bit_cast<uint32_t>(static_cast<float>(values[i])))
          << what << " element " << i;
    }
  };
  const std::string shape = "(" + std::to_string(values.size()) + ",)";
  for (bool big : {false, true}) {
    const std::string order = big ? ">" : "<";
    expect_values(io::decode_float_npy(
                      npy(dict_of(order + "f8", shape), bytes_of<double>(values, big)), "f", "a"),
                  order + "f8");
    std::vector<float> f(values.begin(), values.end());
    expect_values(
        io::decode_float_npy(npy(dict_of(order + "f4", shape), bytes_of<float>(f, big)), "f", "a"),
        order + "f4");
    // binary16 bit patterns of the same values.
    const std::vector<uint16_t> h{0x3e00, 0xc080, 0x0001, 0x0030, 0x8000, 0x7bff, 0x7c00};
    expect_values(io::decode_float_npy(
                      npy(dict_of(order + "f2", shape), bytes_of<uint16_t>(h, big)), "f", "a"),
                  order + "f2");
  }
  const auto nan =
      io::decode_float_npy(npy(dict_of("<f2", "(1,)"), bytes_of<uint16_t>({0x7e00})), "f", "a");
  EXPECT_TRUE(std::isnan(nan.values[0]));  // NaN is carried; the library refuses it when used
}

TEST(Npy, FortranOrderOfEveryRankIsTransposedToC) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{5}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}, {1, 1, 1, 7}, {2, 2, 2, 2, 3}}) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    // Element at C index c holds the value c; written in Fortran order (first axis fastest).
    std::vector<double> fortran(static_cast<size_t>(n));
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t f = 0; f < n; ++f) {
      int64_t c = 0;
      for (size_t a = 0; a < shape.size(); ++a) c = c * shape[a] + idx[a];
      fortran[static_cast<size_t>(f)] = static_cast<double>(c);
      for (size_t a = 0; a < shape.size(); ++a) {
        if (++idx[a] < shape[a]) break;
        idx[a] = 0;
      }
    }
    std::string tuple = "(";
    for (int64_t s : shape) tuple += std::to_string(s) + ",";
    tuple += ")";
    const io::NpyArray a =
        io::decode_float_npy(npy(dict_of(">f8", tuple, true), bytes_of(fortran, true)), "f", "a");
    EXPECT_EQ(a.shape, shape);
    for (int64_t c = 0; c < n; ++c) ASSERT_EQ(a.values[static_cast<size_t>(c)], float(c)) << tuple;
  }
}

TEST(Npy, LimitsAreCheckedBeforeAnyAllocation) {
  const std::string small = bytes_of<float>({1, 2, 3, 4});
  EXPECT_NE(decode_error(npy(dict_of("<f4", "(1099511627777,)"), small)).find("over the maximum"),
            std::string::npos);
  EXPECT_NE(decode_error(npy(dict_of("<f4", "(4294967296, 4294967296)"), small))
                .find("more than the maximum"),
            std::string::npos);
  EXPECT_NE(decode_error(npy(dict_of("<f4", "(99999999999999999999999,)"), small))
                .find("over the maximum"),
            std::string::npos);
  std::string rank33 = "(";
  for (int i = 0; i < 33; ++i) rank33 += "1,";
  EXPECT_NE(decode_error(npy(dict_of("<f4", rank33 + ")"), small)).find("more than 32 dimensions"),
            std::string::npos);
  std::string long_header = npy(dict_of("<f4", "(4,)"), small, 2);
  long_header[8] = 0;
  long_header[9] = 0;
  long_header[10] = 2;  // 131072 bytes
  EXPECT_NE(decode_error(long_header).find("over the maximum of 65536"), std::string::npos);
  EXPECT_NE(decode_error(npy(dict_of("<U999999999", "()"), small)).find("not a plain numeric"),
            std::string::npos);
  // A header that declares 2^36 floats (256 GiB) over 16 bytes of data: refused as
  // truncated, with no allocation of its size.
  cli::reset_heap_peak();
  EXPECT_NE(decode_error(npy(dict_of("<f4", "(65536, 1048576)"), small)).find("truncated"),
            std::string::npos);
  EXPECT_LT(cli::heap_peak_growth(), int64_t{1} << 20);
  cli::reset_heap_peak();  // the tracker sees allocations (the check above is not vacuous)
  const std::vector<char> two_mib(size_t{2} << 20, 1);
  EXPECT_GE(cli::heap_peak_growth(), int64_t{2} << 20);
}

TEST_F(NpyFile, Float32CIsUsedInPlaceOthersAreConvertedOnce) {
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  const auto f =
      io::map_float_npy(write("a.npy", npy(dict_of("<f4", "(2, 3)"), bytes_of(v))), "--q");
  EXPECT_TRUE(f.in_place);
  EXPECT_EQ(std::vector<float>(f.data, f.data + 6), v);
  const auto g = io::map_float_npy(
      write("b.npy", npy(dict_of("<f4", "(2, 3)", true), bytes_of<float>({1, 4, 2, 5, 3, 6}))),
      "--q");
  EXPECT_FALSE(g.in_place);
  EXPECT_EQ(std::vector<float>(g.data, g.data + 6), v);
  const auto h =
      io::map_float_npy(write("c.npy", npy(dict_of(">f4", "(6,)"), bytes_of(v, true))), "--q");
  EXPECT_FALSE(h.in_place);
  EXPECT_EQ(std::vector<float>(h.data, h.data + 6), v);
  // A file whose data does not start at a multiple of 4 bytes is copied, not misread.
  std::string odd = npy(dict_of("<f4", "(6,)"), "");
  odd.insert(odd.size() - 1, " ");  // one more blank: data offset 65 (odd)
  odd[8] = char(odd[8] + 1);
  const auto o = io::map_float_npy(write("d.npy", odd + bytes_of(v)), "--q");
  EXPECT_FALSE(o.in_place);
  EXPECT_EQ(std::vector<float>(o.data, o.data + 6), v);
}

TEST_F(NpyFile, PipesDirectoriesAndMissingFiles) {
  const std::vector<float> v{1, 2, 3};
  const std::string fifo = (dir / "pipe.npy").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer(
      [&] { std::ofstream(fifo, std::ios::binary) << npy(dict_of("<f4", "(3,)"), bytes_of(v)); });
  const auto f = io::map_float_npy(fifo, "--q");
  writer.join();
  EXPECT_EQ(std::vector<float>(f.data, f.data + 3), v);
  EXPECT_NE(error_of([&] { io::map_float_npy(dir.string(), "--q"); }).find("is a directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              io::map_float_npy((dir / "none.npy").string(), "--q");
            }).find("cannot open (No such file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { io::map_float_npy(write("e.npy", ""), "--q"); }).find("empty file"),
            std::string::npos);
}

TEST_F(NpyFile, MasksOfEveryIntegerDtypeAndByteOrder) {
  const std::string p =
      write("m.npy", npy(dict_of(">i4", "(2, 2)", true), bytes_of<int32_t>({0, 256, 1, 0}, true)));
  const io::NpyArray m = io::read_mask_npy(p, "--key-mask");
  EXPECT_EQ(m.flags, (std::vector<uint8_t>{0, 1, 1, 0}));  // Fortran: [0][1] = 1, [1][0] = 256
  EXPECT_EQ(io::decode_int_scalar_npy(npy(dict_of(">i2", "()"), bytes_of<int16_t>({-3}, true)),
                                       "s", "a"),
            -3);
  EXPECT_EQ(
      io::decode_int_scalar_npy(npy(dict_of("<u8", "()"), bytes_of<uint64_t>({7})), "s", "a"), 7);
}

TEST(Npy, QuotedBytesAreEscaped) {
  const std::string message = decode_error(npy(
      "{'descr': '\x1b[31m\x07', 'fortran_order': False, 'shape': (1,)}", bytes_of<float>({1})));
  EXPECT_NE(message.find("\\x1b[31m\\x07"), std::string::npos) << message;
  for (char c : message) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << message;
  EXPECT_EQ(io::printable("a\\b\n\xff"), "a\\\\b\\x0a\\xff");
  EXPECT_EQ(io::printable(std::string(100, 'x'), 8), "xxxxxxxx...");
  // Whole messages: valid UTF-8 kept, control bytes and broken sequences escaped.
  EXPECT_EQ(io::terminal_safe("caf\xc3\xa9 \x1b]0;x\x07 \xc3 \xed\xa0\x80"),
            "caf\xc3\xa9 \\x1b]0;x\\x07 \\xc3 \\xed\\xa0\\x80");
}

TEST_F(NpyFile, StagedFloatOutputRoundTripsAndEmptyStagesWork) {
  const std::vector<float> v(1000, 0.5f);
  {
    io::StagedOutputs out;
    out.stage_f32((dir / "y.npy").string(), {10, 100}, v.data(), "--out");
    out.stage((dir / "empty").string(), "", "--out");
    out.commit();
  }
  const io::NpyArray a = io::read_float_npy((dir / "y.npy").string(), "t");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(a.values, v);
  EXPECT_EQ(fs::file_size(dir / "empty"), 0u);
  EXPECT_EQ(fs::file_size(dir / "y.npy"), 128u + 4000u);
}

}  // namespace
}  // namespace favor
