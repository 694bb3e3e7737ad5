#pragma once
// The comparisons of the MPI tests: one distributed forward or backward call on this rank's
// slices against the single-process call on the whole problem.
#include <string>

#include "mpi_fixture.hpp"

namespace favor::mpitest {

/// Checks errors against kTolerance and reports the worst over every rank on rank 0.
class Worst {
 public:
  explicit Worst(std::string what) : what_(std::move(what)) {}
  void check(double error, const std::string& label) {
    EXPECT_LE(error, kTolerance) << what_ << ": " << label << " on rank " << rank() << " of "
                                 << size();
    worst_ = std::max(worst_, error);
  }
  ~Worst() {  // collective: every rank ends the same tests
    MPI_Allreduce(MPI_IN_PLACE, &worst_, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank() == 0)
      std::printf("    %s: worst error %.2e (P = %d)\n", what_.c_str(), worst_, size());
  }
  Worst(const Worst&) = delete;
  Worst& operator=(const Worst&) = delete;

 private:
  std::string what_;
  double worst_ = 0.0;
};

/// Options of the whole problem and of this rank's slice (the mask, when asked for, cut).
struct Call {
  AttentionOptions full, local;
  Call(const Problem& p, const Local& l, AttentionOptions o, bool masked) : full(o), local(o) {
    if (masked) {
      full.key_mask = KeyMaskView::contiguous(p.mask.data(), p.batch, p.nk);
      local.key_mask = l.mask_view();
    }
  }
};

inline void compare_forward(const Problem& p, const Local& l, const FeatureMap& map,
                            const AttentionOptions& o, bool masked, Worst& worst,
                            const std::string& label) {
  const Call c(p, l, o, masked);
  const Tensor want = favor_attention(p.q, p.k, p.v, map, c.full);
  Tensor out = l.empty_out();
  distributed::attention(l.q, l.k, l.v, map, out.mutable_view(), c.local);
  worst.check(slice_error(want, l.qs, out), label + " out");
}

inline std::vector<float> to_float(const std::vector<double>& x) {
  return std::vector<float>(x.begin(), x.end());
}

/// dq, dk, dv of this rank's slices and, with `parameters`, the parameter gradients summed
/// over ranks.
inline void compare_backward(const Problem& p, const Local& l, const FeatureMap& map,
                             const AttentionOptions& o, bool masked, bool parameters, Worst& worst,
                             const std::string& label) {
  const Call c(p, l, o, masked);
  const AttentionGrads want =
      favor_attention_backward(p.q, p.k, p.v, p.dy, map, c.full, parameters);
  const AttentionGrads got =
      distributed::attention_backward(l.q, l.k, l.v, l.dy, map, c.local, parameters);
  worst.check(slice_error(want.dq, l.qs, got.dq), label + " dq");
  worst.check(slice_error(want.dk, l.ks, got.dk), label + " dk");
  worst.check(slice_error(want.dv, l.ks, got.dv), label + " dv");
  if (!parameters) return;
  const std::pair<const std::vector<float>*, const std::vector<float>*> params[] = {
      {&want.dw, &got.dw}, {&want.dbias, &got.dbias}, {&want.dlambda, &got.dlambda}};
  const char* names[] = {" dw", " dbias", " dlambda"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(params[i].first->size(), params[i].second->size()) << label << names[i];
    if (params[i].first->empty()) continue;
    worst.check(vector_error(*params[i].first, sum_over_ranks(*params[i].second)),
                label + names[i]);
  }
  EXPECT_EQ(want.ddecay.size(), got.ddecay.size()) << label << " ddecay";
  if (!want.ddecay.empty()) {
    worst.check(vector_error(to_float(want.ddecay), to_float(sum_over_ranks(got.ddecay))),
                label + " ddecay");
  }
}

}  // namespace favor::mpitest
