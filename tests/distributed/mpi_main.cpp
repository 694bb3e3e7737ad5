// main() of the MPI tests: MPI_Init, Google Test on every rank, MPI_Finalize. Rank 0 prints
// the usual gtest report; the other ranks print only their failures, prefixed with their
// rank. Every rank exits nonzero when any rank failed a test, so mpirun (and CTest) fail.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

// The failures of a rank other than 0, one line each, with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int ranks_failed = 0;
  MPI_Allreduce(&failed, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("MPI tests on %d rank(s): %s\n", size,
                ranks_failed == 0 ? "passed on every rank" : "FAILED");
    if (ranks_failed > 0) std::printf("%d rank(s) failed a test\n", ranks_failed);
  }
  MPI_Finalize();
  return ranks_failed == 0 ? 0 : 1;
}
