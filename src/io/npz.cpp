#include "npz.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "favor/error.hpp"
#include "npy.hpp"
#include "printable.hpp"

namespace favor::io {
namespace {

// Zip record signatures and sizes (PKWARE APPNOTE 4.3).
constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                   kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kZip64LocatorSize = 20,
                 kZip64EndSize = 56;
constexpr uint16_t kStored = 0, kDeflated = 8;
constexpr uint16_t kVersion = 20;            // 2.0: stored and deflated members
constexpr uint16_t kMadeBy = (3 << 8) | 20;  // Unix, 2.0: the attributes below are rwx bits
constexpr uint32_t kAttributes = 0644u << 16;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01 00:00: reproducible files
// Deflate expands at most ~1032:1; larger claims are corrupt (and would allocate blindly).
constexpr uint64_t kMaxDeflateRatio = 1032;

uint32_t crc32_of(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

void put16(std::string& out, uint16_t v) {
  out += static_cast<char>(v & 0xff);
  out += static_cast<char>(v >> 8);
}
void put32(std::string& out, uint32_t v) {
  put16(out, static_cast<uint16_t>(v & 0xffff));
  put16(out, static_cast<uint16_t>(v >> 16));
}

// The fields a member's local header and its central directory entry share (version needed
// to extract through extra field length), for a stored member of `size` bytes.
void put_member_fields(std::string& out, uint32_t crc, uint32_t size, size_t name_length) {
  put16(out, kVersion);
  put16(out, 0);  // flags
  put16(out, kStored);
  put16(out, 0);  // time
  put16(out, kDosDate);
  put32(out, crc);
  put32(out, size);  // compressed
  put32(out, size);  // uncompressed
  put16(out, static_cast<uint16_t>(name_length));
  put16(out, 0);  // extra
}

// Bounds-checked little-endian reads of the archive, failing with the file's name.
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path, const std::string& argument)
      : bytes_(bytes), path_(path), argument_(argument) {}
  [[noreturn]] void fail(const std::string& rule) const {
    throw Error(argument_ + ": " + path_ + ": not a valid .npz archive: " + rule);
  }
  void need(uint64_t offset, uint64_t size, const char* what) const {
    if (offset > bytes_.size() || size > bytes_.size() - offset)
      fail(std::string("truncated ") + what);
  }
  uint64_t get(uint64_t offset, int width) const {
    need(offset, width, "record");
    uint64_t v = 0;
    for (int i = 0; i < width; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[offset + i])) << (8 * i);
    return v;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  const std::string& bytes_;
  const std::string &path_, &argument_;
};

struct Directory {
  uint64_t entries = 0, offset = 0, size = 0;
};

// The end of central directory record (searched back over a comment of up to 64 KiB), and
// the zip64 end record when the classic fields overflow.
Directory find_directory(const Reader& r) {
  const uint64_t n = r.bytes().size();
  if (n < kEndSize) r.fail("too short for a zip archive (" + std::to_string(n) + " bytes)");
  uint64_t end = n - kEndSize;
  const uint64_t lowest = end > 0xffff ? end - 0xffff : 0;
  while (r.get(end, 4) != kEndSig) {
    if (end == lowest) r.fail("no end of central directory record (truncated, or not a zip)");
    --end;
  }
  if (r.get(end + 4, 2) != 0 || r.get(end + 6, 2) != 0)
    r.fail("multi-disk archives are not supported");
  Directory d{r.get(end + 10, 2), r.get(end + 16, 4), r.get(end + 12, 4)};
  if (d.entries == 0xffff || d.offset == 0xffffffff || d.size == 0xffffffff) {
    if (end < kZip64LocatorSize || r.get(end - kZip64LocatorSize, 4) != kZip64LocatorSig)
      r.fail("zip64 sizes without a zip64 end record locator");
    const uint64_t at = r.get(end - kZip64LocatorSize + 8, 8);
    r.need(at, kZip64EndSize, "zip64 end record");
    if (r.get(at, 4) != kZip64EndSig) r.fail("bad zip64 end record signature");
    d = {r.get(at + 32, 8), r.get(at + 48, 8), r.get(at + 40, 8)};
  }
  r.need(d.offset, d.size, "central directory");
  return d;
}

struct Entry {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, local = 0;
};

// One central directory entry at `at`; returns the offset of the next.
uint64_t read_entry(const Reader& r, uint64_t at, Entry& e) {
  r.need(at, kCentralSize, "central directory entry");
  if (r.get(at, 4) != kCentralSig) r.fail("bad central directory entry signature");
  e.flags = static_cast<uint16_t>(r.get(at + 8, 2));
  e.method = static_cast<uint16_t>(r.get(at + 10, 2));
  e.crc = static_cast<uint32_t>(r.get(at + 16, 4));
  e.compressed = r.get(at + 20, 4);
  e.size = r.get(at + 24, 4);
  const uint64_t name_len = r.get(at + 28, 2), extra_len = r.get(at + 30, 2),
                 comment_len = r.get(at + 32, 2);
  e.local = r.get(at + 42, 4);
  r.need(at + kCentralSize, name_len + extra_len + comment_len, "central directory entry");
  e.name = r.bytes().substr(at + kCentralSize, name_len);
  // Zip64 extended information: the 8-byte values of the fields saturated above, in order.
  for (uint64_t x = at + kCentralSize + name_len, stop = x + extra_len; x + 4 <= stop;) {
    const uint64_t id = r.get(x, 2), len = r.get(x + 2, 2);
    if (x + 4 + len > stop) r.fail("bad extra field in entry '" + printable(e.name) + "'");
    if (id == 0x0001) {
      uint64_t p = x + 4;
      for (uint64_t* field : {&e.size, &e.compressed, &e.local}) {
        if (*field != 0xffffffff) continue;
        if (p + 8 > x + 4 + len) r.fail("short zip64 field in entry '" + printable(e.name) + "'");
        *field = r.get(p, 8);
        p += 8;
      }
    }
    x += 4 + len;
  }
  return at + kCentralSize + name_len + extra_len + comment_len;
}

std::string inflate_raw(const Reader& r, const char* data, uint64_t n, uint64_t size,
                        const std::string& name) {
  std::string out(size, '\0');
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)
    r.fail("zlib cannot start inflating '" + printable(name) + "'");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  uint64_t in_left = n, out_left = size;
  int rc = Z_OK;
  while (rc == Z_OK) {
    // zlib counts in uInt: feed at most 1 GiB at a time.
    const auto in_chunk = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
    const auto out_chunk = static_cast<uInt>(std::min<uint64_t>(out_left, 1u << 30));
    zs.avail_in = in_chunk;
    zs.avail_out = out_chunk;
    rc = inflate(&zs, Z_NO_FLUSH);
    in_left -= in_chunk - zs.avail_in;
    out_left -= out_chunk - zs.avail_out;
    if (rc == Z_OK && zs.avail_in == in_chunk && zs.avail_out == out_chunk) break;  // stuck
  }
  inflateEnd(&zs);
  if (rc != Z_STREAM_END || out_left != 0) {
    r.fail("member '" + printable(name) + "': corrupt or truncated deflate data" +
           (rc == Z_STREAM_END ? " (shorter than its recorded size)" : ""));
  }
  return out;
}

// The data of entry e, from its local header, decompressed and CRC-checked.
std::string member_data(const Reader& r, const Entry& e) {
  if (e.flags & 1) r.fail("member '" + printable(e.name) + "' is encrypted");
  r.need(e.local, kLocalSize, "local header");
  if (r.get(e.local, 4) != kLocalSig)
    r.fail("bad local header signature of '" + printable(e.name) + "'");
  const uint64_t start = e.local + kLocalSize + r.get(e.local + 26, 2) + r.get(e.local + 28, 2);
  r.need(start, e.compressed, "member data");
  const char* data = r.bytes().data() + start;
  std::string out;
  if (e.method == kStored) {
    if (e.compressed != e.size) r.fail("stored member '" + printable(e.name) + "' has two sizes");
    out.assign(data, e.size);
  } else if (e.method == kDeflated) {
    if (e.size > e.compressed * kMaxDeflateRatio + 1024)
      r.fail("member '" + printable(e.name) + "' claims an impossible size");
    out = inflate_raw(r, data, e.compressed, e.size, e.name);
  } else {
    r.fail("member '" + printable(e.name) + "' uses compression method " +
           std::to_string(e.method) + " (only stored and deflate are supported)");
  }
  if (crc32_of(out.data(), out.size()) != e.crc)
    r.fail("CRC-32 mismatch in member '" + printable(e.name) + "'");
  return out;
}

}  // namespace

std::string encode_npz(const std::vector<NpzMember>& members) {
  std::string out, directory;
  for (const NpzMember& m : members) {
    const std::string name = m.name + ".npy";
    const uint64_t offset = out.size();
    if (m.bytes.size() >= 0xffffffffu || offset + m.bytes.size() + 1024 >= 0xffffffffu)
      throw Error("npz: member '" + m.name + "' would need zip64 (4 GiB or more)");
    const uint32_t crc = crc32_of(m.bytes.data(), m.bytes.size());
    const auto size = static_cast<uint32_t>(m.bytes.size());
    // Local header.
    put32(out, kLocalSig);
    put_member_fields(out, crc, size, name.size());
    out += name;
    out += m.bytes;
    // Central directory entry.
    put32(directory, kCentralSig);
    put16(directory, kMadeBy);
    put_member_fields(directory, crc, size, name.size());
    put16(directory, 0);  // comment
    put16(directory, 0);  // disk
    put16(directory, 0);  // internal attributes
    put32(directory, kAttributes);
    put32(directory, static_cast<uint32_t>(offset));
    directory += name;
  }
  const uint64_t directory_offset = out.size();
  if (members.size() >= 0xffff || directory_offset + directory.size() >= 0xffffffffu)
    throw Error("npz: the archive would need zip64 (4 GiB or 65535 members)");
  out += directory;
  put32(out, kEndSig);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint16_t>(members.size()));
  put16(out, static_cast<uint16_t>(members.size()));
  put32(out, static_cast<uint32_t>(directory.size()));
  put32(out, static_cast<uint32_t>(directory_offset));
  put16(out, 0);  // comment
  return out;
}

std::map<std::string, std::string> decode_npz(const std::string& bytes, const std::string& path,
                                              const std::string& argument) {
  const Reader r(bytes, path, argument);
  const Directory d = find_directory(r);
  std::map<std::string, std::string> members;
  uint64_t at = d.offset;
  for (uint64_t i = 0; i < d.entries; ++i) {
    Entry e;
    at = read_entry(r, at, e);
    if (at > d.offset + d.size) r.fail("central directory overruns its recorded size");
    std::string name = e.name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0)
      name.resize(name.size() - 4);
    if (members.count(name)) r.fail("member '" + printable(e.name) + "' appears twice");
    members[name] = member_data(r, e);
  }
  return members;
}

std::map<std::string, std::string> read_npz(const std::string& path, const std::string& argument) {
  return decode_npz(read_file(path, argument), path, argument);
}

}  // namespace favor::io
