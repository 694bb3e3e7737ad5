#pragma once
// What every sequence-parallel call (favor/sequence_parallel.hpp: FAVOR and Transformer-VQ)
// does before it computes: every rank learns whether any rank refused its inputs, and why;
// then the ranks compare the fields they must agree on (shapes but N, options, map or
// codebook, as numbers and hashes), so that bad use throws the same favor::Error on every
// rank instead of leaving one waiting in a collective.
#include <cstdint>
#include <string>
#include <vector>

#include "favor/sequence_parallel.hpp"

namespace favor::detail {

uint64_t bits_of(double x);
/// Multiply-xor hashes of the bits of the values, in order.
uint64_t hash_doubles(const std::vector<double>& xs);
uint64_t hash_floats(const float* xs, int64_t n);

/// A field the ranks must agree on: its name in the message, and whether the message shows
/// both ranks' values (sizes) or only that they differ (flags, bits, hashes).
struct AgreedField {
  const char* name;
  bool show_values;
};

/// mine: this rank's error message ("" when its inputs passed). One allgather; when any rank
/// failed, every rank throws Error("<what>: rank r: <message>[ (and k more rank(s) ...)]").
void agree_on_errors(Exchange& ex, const std::string& mine, const std::string& what,
                     SequenceParallelStats& st);

/// mine: the values of `fields`, then this rank's (Nq, Nk) (checked: exactly two extra values; the
/// same on every rank). One allgather; at the first field on which a rank differs from rank 0,
/// every rank throws Error("<what>: the ranks disagree on the <name> (...); <rule>"). Returns every
/// rank's extra values, in rank order.
std::vector<int64_t> agree_on_fields(Exchange& ex, const std::vector<int64_t>& mine,
                                     const std::vector<AgreedField>& fields,
                                     const std::string& what, const std::string& rule,
                                     SequenceParallelStats& st);

/// From every rank's (Nq, Nk) in rank order: st.offset (this rank's first key) and st.total
/// (keys over all ranks). Causal: the queries' offset must be the keys' (throws otherwise).
void slice_positions(const std::vector<int64_t>& lengths, int rank, bool causal,
                     const std::string& what, SequenceParallelStats& st);

}  // namespace favor::detail
