#include "npy_slice.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "favor/error.hpp"
#include "io_names.hpp"

namespace favor::cli {
namespace {

// `count` bytes at `offset` of an open file.
void read_at(std::ifstream& in, size_t offset, char* out, size_t count, const std::string& path,
             const std::string& argument) {
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out, static_cast<std::streamsize>(count));
  if (static_cast<size_t>(in.gcount()) != count)
    throw Error(argument + ": " + path + ": read error at byte " + std::to_string(offset));
}

std::ifstream open_file(const std::string& path, const std::string& argument) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(argument + ": " + path + ": cannot open (" + std::strerror(errno) + ")");
  return in;
}

// Refuses a value that is not finite as float32, as the library would, but at its position in
// the file: the library sees only a process's slice and would name the row within it.
[[noreturn]] void refuse_nonfinite(const RowsFile& f, double value, int64_t bh, int64_t row,
                                   int64_t x) {
  std::string where = std::to_string(row) + ',' + std::to_string(x);
  if (f.rank == 4) {
    where = std::to_string(bh / f.shape[1]) + ',' + std::to_string(bh % f.shape[1]) + ',' + where;
  }
  const std::string what = std::isfinite(value) ? fmt::format("{} (beyond float32's range)", value)
                                                : fmt::format("{}", value);
  throw Error(f.argument + ": " + f.path + ": element [" + where + "] is " + what +
              "; inputs must be finite (no NaN or Inf)");
}

}  // namespace

RowsFile open_rows(const std::string& path, const std::string& argument) {
  RowsFile f{path, argument, read_npy_header(path, argument), 4, {}};
  const NpyHeader& h = f.header;
  const std::string& d = h.descr;
  if (d != "<f4" && d != "<f8" && d != "=f4" && d != "=f8") {
    throw Error(argument + ": " + path + ": dtype '" + printable(d) +
                "' is not supported; use little-endian float32 or float64");
  }
  f.rank = h.shape.size();
  if (f.rank == 2) {
    f.shape = {1, 1, h.shape[0], h.shape[1]};
  } else if (f.rank == 4) {
    f.shape = {h.shape[0], h.shape[1], h.shape[2], h.shape[3]};
  } else {
    throw Error(argument + ": " + path + ": must be 2-D [N, D] or 4-D [B, H, N, D], has rank " +
                std::to_string(f.rank));
  }
  if (h.fortran) {
    throw Error(argument + ": " + path +
                ": is in Fortran order; --distributed reads slices of C-order arrays (save it "
                "with numpy.ascontiguousarray)");
  }
  return f;
}

Tensor read_rows(const RowsFile& f, int64_t begin, int64_t end) {
  const Shape4& s = f.shape;
  Tensor t({s[0], s[1], end - begin, s[3]});
  if (end == begin) return t;
  std::ifstream in = open_file(f.path, f.argument);
  const size_t item = f.header.item, run = static_cast<size_t>((end - begin) * s[3]);
  std::vector<char> bytes(run * item);
  for (int64_t bh = 0; bh < s[0] * s[1]; ++bh) {
    const auto first = static_cast<size_t>((bh * s[2] + begin) * s[3]);
    read_at(in, f.header.data_offset + first * item, bytes.data(), bytes.size(), f.path,
            f.argument);
    float* out = t.data() + bh * static_cast<int64_t>(run);
    if (item == 4) {
      std::memcpy(out, bytes.data(), bytes.size());
    } else {
      for (size_t i = 0; i < run; ++i) {
        double x;
        std::memcpy(&x, bytes.data() + 8 * i, 8);
        out[i] = static_cast<float>(x);
      }
    }
    for (size_t i = 0; i < run; ++i) {
      if (std::isfinite(out[i])) continue;
      double x = out[i];  // float64 files: the value before the conversion
      if (item == 8) std::memcpy(&x, bytes.data() + 8 * i, 8);
      const auto local = static_cast<int64_t>(i);
      refuse_nonfinite(f, x, bh, begin + local / s[3], local % s[3]);
    }
  }
  return t;
}

std::vector<uint8_t> read_mask_columns(const std::string& path, size_t input_rank, int64_t batch,
                                       int64_t nk, int64_t begin, int64_t end) {
  const NpyHeader h = read_npy_header(path, "--key-mask");
  const std::vector<int64_t> expected =
      input_rank == 2 ? std::vector<int64_t>{nk} : std::vector<int64_t>{batch, nk};
  if (h.shape != expected) {
    const std::string want =
        input_rank == 2 ? "[Nk] = [" + std::to_string(nk) + "]"
                        : "[B, Nk] = [" + std::to_string(batch) + ", " + std::to_string(nk) + "]";
    throw Error("--key-mask: " + path + ": must have shape " + want);
  }
  const std::string& d = h.descr;
  const bool integer =
      d == "|b1" || d == "|u1" || d == "|i1" ||
      (d.size() == 3 && (d[0] == '<' || d[0] == '=') && (d[1] == 'i' || d[1] == 'u') &&
       (d[2] == '2' || d[2] == '4' || d[2] == '8'));
  if (!integer) {
    throw Error("--key-mask: " + path + ": dtype '" + printable(d) +
                "' is not supported; a mask is bool or 0/1 integers");
  }
  if (h.fortran && input_rank != 2) {
    throw Error("--key-mask: " + path +
                ": is in Fortran order; --distributed reads slices of C-order arrays");
  }
  std::vector<uint8_t> flags;
  if (end == begin) return flags;
  std::ifstream in = open_file(path, "--key-mask");
  std::vector<char> bytes(static_cast<size_t>(end - begin) * h.item);
  for (int64_t b = 0; b < batch; ++b) {
    read_at(in, h.data_offset + static_cast<size_t>(b * nk + begin) * h.item, bytes.data(),
            bytes.size(), path, "--key-mask");
    for (int64_t j = 0; j < end - begin; ++j) {
      bool nonzero = false;
      for (size_t x = 0; x < h.item; ++x) nonzero = nonzero || bytes[j * h.item + x] != 0;
      flags.push_back(nonzero ? 1 : 0);
    }
  }
  return flags;
}

}  // namespace favor::cli
