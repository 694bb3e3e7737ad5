#pragma once
// NumPy .npz archives: a zip of .npy members (np.savez stores them, np.savez_compressed
// deflates them). The writer stores (no compression) with CRC-32s, as np.savez does; the
// reader takes stored and deflated members, checks every size, offset and CRC-32, and throws
// favor::Error naming the argument and the file on anything malformed or truncated.
#include <map>
#include <string>
#include <vector>

namespace favor::io {

struct NpzMember {
  std::string name;   // without ".npy"
  std::string bytes;  // the .npy file
};

/// The bytes of an .npz holding `members` in order (as "<name>.npy"), store-only. Throws
/// favor::Error if a member or the archive needs zip64 (4 GiB or more).
std::string encode_npz(const std::vector<NpzMember>& members);

/// Every member of the archive `bytes` (read from `path`): name (".npy" dropped) -> .npy
/// bytes. Zip64 records are understood; encrypted, multi-disk and other compression methods
/// are refused, as are duplicate names.
std::map<std::string, std::string> decode_npz(const std::string& bytes, const std::string& path,
                                              const std::string& argument);
/// decode_npz of the file at `path`.
std::map<std::string, std::string> read_npz(const std::string& path, const std::string& argument);

}  // namespace favor::io
