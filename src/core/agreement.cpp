#include "core/agreement.hpp"

#include <cstring>
#include <sstream>

#include "favor/error.hpp"

namespace favor::detail {
namespace {

constexpr uint64_t kHashStart = 1469598103934665603ull, kHashPrime = 1099511628211ull;

}  // namespace

uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

uint64_t hash_doubles(const std::vector<double>& xs) {
  uint64_t h = kHashStart;
  for (double x : xs) h = (h ^ bits_of(x)) * kHashPrime;
  return h;
}

uint64_t hash_floats(const float* xs, int64_t n) {
  uint64_t h = kHashStart;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, xs + i, sizeof b);
    h = (h ^ b) * kHashPrime;
  }
  return h;
}

void agree_on_errors(Exchange& ex, const std::string& mine, const std::string& what,
                     SequenceParallelStats& st) {
  const std::vector<std::string> all = ex.allgather_text(mine);
  ++st.collectives;
  std::ostringstream os;
  int failed = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    if (failed++ == 0) os << "rank " << r << ": " << all[r];
  }
  if (failed > 1) os << " (and " << failed - 1 << " more rank(s) refused their inputs)";
  if (failed > 0) throw Error(what + ": " + os.str());
}

std::vector<int64_t> agree_on_fields(Exchange& ex, const std::vector<int64_t>& mine,
                                     const std::vector<AgreedField>& fields,
                                     const std::string& what, const std::string& rule,
                                     SequenceParallelStats& st) {
  // The callers send their fields, then (Nq, Nk): a field added to one list and not the other
  // would shift every later value (caught here, before any rank can depend on it).
  if (mine.size() != fields.size() + 2) {
    throw Error(what + ": internal error: " + std::to_string(mine.size()) + " values for " +
                std::to_string(fields.size()) + " agreed fields and (Nq, Nk)");
  }
  const std::vector<int64_t> all = ex.allgather(mine);
  ++st.collectives;
  const size_t width = mine.size(), count = fields.size();
  const size_t ranks = all.size() / width;
  for (size_t f = 0; f < count; ++f) {
    for (size_t r = 1; r < ranks; ++r) {
      if (all[r * width + f] == all[f]) continue;
      std::ostringstream os;
      os << what << ": the ranks disagree on the " << fields[f].name << " (rank 0";
      if (fields[f].show_values)
        os << ": " << all[f] << ", rank " << r << ": " << all[r * width + f];
      else
        os << " and rank " << r << " differ";
      os << "); " << rule;
      throw Error(os.str());
    }
  }
  std::vector<int64_t> extra;
  for (size_t r = 0; r < ranks; ++r)
    extra.insert(extra.end(), all.begin() + static_cast<std::ptrdiff_t>(r * width + count),
                 all.begin() + static_cast<std::ptrdiff_t>((r + 1) * width));
  return extra;
}

void slice_positions(const std::vector<int64_t>& lengths, int rank, bool causal,
                     const std::string& what, SequenceParallelStats& st) {
  for (int r = 0; r < rank; ++r) st.offset += lengths[2 * r + 1];
  for (size_t r = 0; r < lengths.size() / 2; ++r) st.total += lengths[2 * r + 1];
  if (causal) {  // causal slices cover the same positions for queries and keys
    int64_t q_offset = 0;
    for (int r = 0; r < rank; ++r) q_offset += lengths[2 * r];
    if (q_offset != st.offset) throw Error(what + ": causal slices differ");
  }
}

}  // namespace favor::detail
