// MpiExchange: the collectives of sequence-parallel attention over an MPI communicator. The
// state records travel as one contiguous MPI datatype each and are combined by a user MPI
// operation that calls combine_states; it is declared non-commutative, so MPI reduces in rank
// order (MPI: inoutvec = invec (op) inoutvec, invec from the lower ranks), which is the
// order combine_states(earlier, later) needs.
#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <utility>

#include "favor/distributed.hpp"
#include "favor/error.hpp"

namespace favor::distributed {
namespace {

// An exception thrown by combine_states inside MPI's callback: it must not cross MPI's C
// frames, so the callback records it and the caller rethrows after the MPI call.
thread_local std::exception_ptr t_combine_error;

void combine_op(void* invec, void* inoutvec, int* len, MPI_Datatype* datatype) {
  try {
    int record_bytes = 0;
    MPI_Type_size(*datatype, &record_bytes);
    combine_states(static_cast<const uint8_t*>(invec), static_cast<uint8_t*>(inoutvec), *len,
                   record_bytes);
  } catch (...) {
    if (!t_combine_error) t_combine_error = std::current_exception();
  }
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(std::string("MpiExchange: ") + call + " failed: " + std::string(text, length));
}

// Adds the seconds of its lifetime to `total`.
class Timed {
 public:
  explicit Timed(double& total) : total_(total), start_(MPI_Wtime()) {}
  ~Timed() { total_ += MPI_Wtime() - start_; }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double& total_;
  double start_;
};

// MPI counts are int: long arrays go in pieces.
template <class T>
void allreduce_sum_chunked(T* data, int64_t n, MPI_Datatype type, MPI_Comm comm) {
  constexpr int64_t kMaxCount = INT_MAX;
  for (int64_t done = 0; done < n; done += kMaxCount) {
    const int count = static_cast<int>(std::min(kMaxCount, n - done));
    check(MPI_Allreduce(MPI_IN_PLACE, data + done, count, type, MPI_SUM, comm), "MPI_Allreduce");
  }
}

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

MpiExchange::MpiExchange(MPI_Comm comm) {
  if (!mpi_active())
    throw Error("MpiExchange: MPI is not initialised (call MPI_Init first) or already finalised");
  if (comm == MPI_COMM_NULL) throw Error("MpiExchange: the communicator is MPI_COMM_NULL");
  try {
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check(MPI_Comm_split(comm_, 0, size_ - 1 - rank_, &reversed_), "MPI_Comm_split");
    check(MPI_Op_create(&combine_op, /*commute=*/0, &combine_), "MPI_Op_create");
  } catch (...) {
    free_handles();
    throw;
  }
}

MpiExchange::~MpiExchange() {
  free_handles();
}

void MpiExchange::free_handles() noexcept {
  if (!mpi_active()) return;  // freeing after MPI_Finalize is erroneous; MPI freed them
  if (combine_ != MPI_OP_NULL) MPI_Op_free(&combine_);
  if (reversed_ != MPI_COMM_NULL) MPI_Comm_free(&reversed_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::vector<int64_t> MpiExchange::allgather(const std::vector<int64_t>& values) {
  if (values.size() > static_cast<size_t>(INT_MAX / std::max(size_, 1)))
    throw Error("MpiExchange::allgather: too many values");
  const int n = static_cast<int>(values.size());
  std::vector<int64_t> all(values.size() * static_cast<size_t>(size_));
  Timed timed(seconds_);
  check(MPI_Allgather(values.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm_),
        "MPI_Allgather");
  bytes_ += n * static_cast<int64_t>(sizeof(int64_t));
  return all;
}

std::vector<std::string> MpiExchange::allgather_text(const std::string& text) {
  if (text.size() > static_cast<size_t>(INT_MAX))
    throw Error("MpiExchange::allgather_text: text longer than INT_MAX");
  Timed timed(seconds_);
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_), "MPI_Allgather");
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[r] = static_cast<int>(total);
    total += lengths[r];
    if (total > INT_MAX) throw Error("MpiExchange::allgather_text: texts longer than INT_MAX");
  }
  std::vector<char> all(static_cast<size_t>(std::max<int64_t>(total, 1)));
  check(MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                       MPI_CHAR, comm_),
        "MPI_Allgatherv");
  bytes_ += static_cast<int64_t>(sizeof(int)) + length;
  std::vector<std::string> texts;
  for (int r = 0; r < size_; ++r) texts.emplace_back(all.data() + offsets[r], lengths[r]);
  return texts;
}

void MpiExchange::allreduce_sum(double* data, int64_t n) {
  Timed timed(seconds_);
  allreduce_sum_chunked(data, n, MPI_DOUBLE, comm_);
  bytes_ += n * static_cast<int64_t>(sizeof(double));
}

void MpiExchange::allreduce_sum(float* data, int64_t n) {
  Timed timed(seconds_);
  allreduce_sum_chunked(data, n, MPI_FLOAT, comm_);
  bytes_ += n * static_cast<int64_t>(sizeof(float));
}

void MpiExchange::allreduce_states(StateBlock& block) {
  reduce_states(block, false, comm_);
}

void MpiExchange::exscan_states(StateBlock& block, bool reverse) {
  reduce_states(block, true, reverse ? reversed_ : comm_);
}

// One record = one element of a contiguous datatype, so that the operation sees whole
// records and learns their size from the datatype.
void MpiExchange::reduce_states(StateBlock& block, bool scan, MPI_Comm comm) {
  if (block.record_bytes() > INT_MAX || block.heads() > INT_MAX)
    throw Error("MpiExchange: a state block of " + std::to_string(block.bytes()) +
                " bytes is beyond MPI's int counts");
  Timed timed(seconds_);
  bytes_ += block.bytes();
  const int count = static_cast<int>(block.heads());
  if (count == 0) return;
  MPI_Datatype record = MPI_DATATYPE_NULL;
  check(MPI_Type_contiguous(static_cast<int>(block.record_bytes()), MPI_BYTE, &record),
        "MPI_Type_contiguous");
  int rc = MPI_Type_commit(&record);
  t_combine_error = nullptr;
  const char* call = scan ? "MPI_Exscan" : "MPI_Allreduce";
  int rank_in_comm = 0;
  if (rc == MPI_SUCCESS && scan) {
    // A copy as the send buffer: MPI_IN_PLACE for MPI_Exscan is MPI-2.2, and the receive
    // buffer of the first rank is left undefined anyway.
    std::vector<uint8_t> mine(block.data(), block.data() + block.bytes());
    rc = MPI_Exscan(mine.data(), block.data(), count, record, combine_, comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &rank_in_comm);
  } else if (rc == MPI_SUCCESS) {
    rc = MPI_Allreduce(MPI_IN_PLACE, block.data(), count, record, combine_, comm);
  }
  MPI_Type_free(&record);
  check(rc, call);
  if (t_combine_error) std::rethrow_exception(std::exchange(t_combine_error, nullptr));
  if (scan && rank_in_comm == 0) block.clear();  // nothing before the first rank
}

}  // namespace favor::distributed
