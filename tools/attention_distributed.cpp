// favor attention --distributed: sequence-parallel FAVOR or Transformer-VQ attention over the
// ranks of mpirun. Rank r reads rows [N r / P, N (r + 1) / P) of q, k, v (and its keys' mask
// columns) by byte offset (and the whole codebook, which is small), the ranks exchange only
// per-head states or per-code sums (favor::distributed), and every rank writes
// its rows of the one output file at their offsets with MPI-IO, so that no rank ever holds
// more than its slice (gathering to rank 0 would need the whole output in one memory, which is
// what splitting the sequence avoids). The file is a temporary beside --out, created with its
// header by rank 0 and renamed into place by rank 0 once every rank has written. Every step
// that may fail on some ranks only (reading, allocating, opening and writing the file) ends in
// an agreement, so that a failure on any rank becomes the same error on every rank (rank 0
// prints it, every rank exits 2) and the temporary is removed; an error that could not be
// agreed on is printed by its rank, which then ends the job (MPI_Abort) rather than leave the
// other ranks waiting in a collective.
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "attention_args.hpp"
#include "commands.hpp"
#include "favor/distributed.hpp"
#include "npy_slice.hpp"
#include "io_names.hpp"

namespace favor::cli {
namespace {

// MPI for the command's lifetime; funneled: favor's OpenMP threads make no MPI calls.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// An error that every rank throws alike: rank 0 reports it, every rank exits 2.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Every rank learns every rank's error text; if any is not empty, every rank throws the first
// (naming its rank unless every rank failed alike).
void fail_together(distributed::MpiExchange& ex, const std::string& mine) {
  const std::vector<std::string> all = ex.allgather_text(mine);
  int first = -1, failed = 0;
  bool alike = true;
  for (int r = 0; r < ex.size(); ++r) {
    if (all[r].empty()) continue;
    if (first < 0) first = r;
    alike = alike && all[r] == all[first];
    ++failed;
  }
  if (failed == 0) return;
  std::string message = all[first];
  if (!(alike && failed == ex.size())) {
    message += fmt::format(" (rank {} of {}", first, ex.size());
    if (failed > 1) message += fmt::format("; {} more rank(s) failed", failed - 1);
    message += ")";
  }
  throw AgreedError(message);
}

// Runs a step that may fail on some ranks only, then agrees on the outcome.
template <class Step>
void together(distributed::MpiExchange& ex, Step&& step) {
  std::string error;
  try {
    step();
  } catch (const std::bad_alloc&) {
    error = "out of memory";
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "failed";
  }
  fail_together(ex, error);
}

// This rank's part of the inputs.
struct Slices {
  RowsFile qf, kf, vf;
  distributed::Slice qs, ks;
  Tensor q, k, v;
  std::vector<uint8_t> mask;
};

// The options' checks that need no file (before any is read).
void check_options(const AttentionArgs& a) {
  if (a.method != "favor" && a.method != "vq") {
    throw Error("--distributed: only --method favor and vq run sequence-parallel (got --method " +
                a.method + ")");
  }
  check_method(a);
  parse_kernel(a.kernel, "--kernel");
  if (a.method != "vq") return;
  attention_vq_options(a);
  if (a.vq.codebook.empty()) {
    throw Error(
        "--codebook: --distributed vq needs a codebook file (learn one beforehand with favor "
        "codebook; k-means over the ranks' slices is not done)");
  }
}

Slices read_slices(const AttentionArgs& a, int rank, int size) {
  check_options(a);
  Slices s{
      open_rows(a.q, "--q"), open_rows(a.k, "--k"), open_rows(a.v, "--v"), {}, {}, {}, {}, {}, {}};
  if (s.qf.rank != s.kf.rank || s.qf.rank != s.vf.rank)
    throw Error("--q, --k, --v: must all be 2-D or all be 4-D");
  const Shape4 &qs = s.qf.shape, &ks = s.kf.shape, &vs = s.vf.shape;
  if (qs[0] != ks[0] || qs[1] != ks[1] || vs[0] != ks[0] || vs[1] != ks[1] || vs[2] != ks[2]) {
    throw Error("--q, --k, --v: shapes " + shape_string(qs) + ", " + shape_string(ks) + ", " +
                shape_string(vs) + " must share B and H, and k and v must share N");
  }
  if (a.causal && qs[2] != ks[2]) {
    throw Error("--causal: q has N = " + std::to_string(qs[2]) +
                " and k has N = " + std::to_string(ks[2]) + "; causal attention needs the same N");
  }
  s.qs = distributed::even_slice(qs[2], rank, size);
  s.ks = distributed::even_slice(ks[2], rank, size);
  s.q = read_rows(s.qf, s.qs.begin, s.qs.end);
  s.k = read_rows(s.kf, s.ks.begin, s.ks.end);
  s.v = read_rows(s.vf, s.ks.begin, s.ks.end);
  if (!a.key_mask.empty()) {
    s.mask = read_mask_columns(a.key_mask, s.kf.rank, ks[0], ks[2], s.ks.begin, s.ks.end);
  }
  return s;
}

// MPI's text for a failed MPI-IO call on `path` (and a hint), as a favor::Error.
Error io_error(const std::string& path, int code, const char* call, const char* hint = "") {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return Error("--out: " + path + ": " + call + " failed (" + std::string(text, length) + ")" +
               hint);
}

// The output file as this rank's own MPI-IO handle. Each rank opens it alone (MPI_COMM_SELF),
// so that open, sync and close involve no other rank: a rank that cannot open the file (a node
// without the shared file system) must not leave the others inside a collective call, and a
// rank that fails can close what it opened without waiting for the others. The ranks agree on
// every step instead (together). Closed by close() or, after a failure, by the destructor.
class OutputFile {
 public:
  explicit OutputFile(std::string path) : path_(std::move(path)) {}
  ~OutputFile() {
    if (file_ != MPI_FILE_NULL) MPI_File_close(&file_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void open() {
    const int rc =
        MPI_File_open(MPI_COMM_SELF, path_.c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &file_);
    if (rc != MPI_SUCCESS) {
      file_ = MPI_FILE_NULL;
      throw io_error(path_, rc, "MPI_File_open",
                     "; every rank writes its rows into this file, which rank 0 created: it "
                     "must be on a file system that every rank sees");
    }
  }

  // This rank's rows of y [B, H, nq_r, Dv] at their offsets in the file, whose header of
  // `header` bytes is already there (the whole sequence has nq rows).
  void write_rows(size_t header, const Tensor& y, const distributed::Slice& qs, int64_t nq) {
    const Shape4& s = y.shape();
    const int64_t run = qs.size() * s[3];             // floats of one (batch, head)
    constexpr int64_t kMaxFloats = int64_t{1} << 28;  // MPI counts are int: 1 GiB pieces
    for (int64_t bh = 0; bh < s[0] * s[1]; ++bh) {
      const int64_t first = (bh * nq + qs.begin) * s[3];
      for (int64_t done = 0; done < run; done += kMaxFloats) {
        const auto count = static_cast<int>(std::min(kMaxFloats, run - done));
        const int rc =
            MPI_File_write_at(file_, static_cast<MPI_Offset>(header + 4 * (first + done)),
                              y.data() + bh * run + done, count, MPI_FLOAT, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) throw io_error(path_, rc, "MPI_File_write_at");
      }
    }
  }

  // Flushes this rank's writes to storage and closes the handle.
  void close() {
    const int sync = MPI_File_sync(file_);
    const int closed = MPI_File_close(&file_);
    file_ = MPI_FILE_NULL;
    if (sync != MPI_SUCCESS) throw io_error(path_, sync, "MPI_File_sync");
    if (closed != MPI_SUCCESS) throw io_error(path_, closed, "MPI_File_close");
  }

 private:
  std::string path_;
  MPI_File file_ = MPI_FILE_NULL;
};

// One line on rank 0: the ranks, their slices and what each sent.
void print_summary(const AttentionArgs& a, distributed::MpiExchange& ex, const Slices& s,
                   const SequenceParallelStats& st, double seconds, int64_t bytes) {
  const std::vector<int64_t> all = ex.allgather(
      {st.payload_bytes, bytes, static_cast<int64_t>(seconds * 1e6), st.zero_rows, s.qs.size()});
  if (ex.rank() != 0) return;
  int64_t payload = 0, sent = 0, micros = 0, zero_rows = 0, rows_min = INT64_MAX, rows_max = 0;
  for (int r = 0; r < ex.size(); ++r) {
    payload = std::max(payload, all[5 * r]);
    sent = std::max(sent, all[5 * r + 1]);
    micros = std::max(micros, all[5 * r + 2]);
    zero_rows += all[5 * r + 3];
    rows_min = std::min(rows_min, all[5 * r + 4]);
    rows_max = std::max(rows_max, all[5 * r + 4]);
  }
  if (zero_rows > 0) {
    std::cerr << "favor: note: " << zero_rows
              << (a.method == "vq" ? " query rows had no visible key and were written as zeros\n"
                                   : " query rows had no visible key or a non-positive "
                                     "denominator and were written as zeros\n");
  }
  std::cout << fmt::format(
      "favor attention --distributed: {} ranks, method {}, Nq = {}, Nk = {} ({}-{} query rows "
      "per rank); per rank: {} bytes of {}, {} bytes in MPI calls, {:.3f} ms in MPI calls "
      "(largest over ranks)\n",
      ex.size(), a.method, s.qf.shape[2], s.kf.shape[2], rows_min, rows_max, payload,
      a.method == "vq" ? "states (per-code sums)" : "states and fits", sent, micros / 1e3);
}

// This rank's rows of the output, [B, H, nq_r, Dv].
Tensor output_rows(const Slices& s) {
  const Shape4 shape{s.qf.shape[0], s.qf.shape[1], s.qs.size(), s.vf.shape[3]};
  try {
    return Tensor(shape);
  } catch (const std::bad_alloc&) {
    throw Error("--out: this rank's rows of the output, " + shape_string(shape) +
                " floats, do not fit in memory");
  }
}

void run(const AttentionArgs& a, distributed::MpiExchange& ex) {
  const bool vq = a.method == "vq";
  std::optional<Slices> s;
  std::optional<FeatureMap> map;  // favor
  Tensor codebook;                // vq: every rank reads all of it
  AttentionOptions o;
  VQOptions vo;
  Tensor y;               // this rank's rows of the output
  std::string header;     // the output file's .npy header: rank 0 writes it, the ranks the data
  StagedOutputs outputs;  // rank 0's files; their temporaries go if anything fails
  // Everything this rank reads or allocates, before the first collective of the computation:
  // a rank that fails here must not leave the others waiting in it.
  together(ex, [&] {
    s.emplace(read_slices(a, ex.rank(), ex.size()));
    if (vq) {
      vo = attention_vq_options(a);
      codebook = read_codebook(a.vq.codebook, s->kf.shape[1], s->kf.shape[3], a.vq.codes);
      if (ex.rank() == 0 && !a.vq.save.empty()) {
        outputs.stage(
            a.vq.save,
            encode_npy_f32(codebook_file_shape(codebook.shape(), s->qf.rank == 2), codebook.data()),
            "--save-codebook");
      }
    } else {
      map.emplace(attention_feature_map(a, s->qf.shape));
      o.causal = a.causal;
      o.decay = attention_decay(a, s->qf.shape[1]);
      o.window = a.window;  // the library refuses hybrid attention here, naming them
      o.sinks = a.sinks;
      if (ex.rank() == 0 && !a.projection.save.empty()) {
        const Projection& w = map->projection;
        outputs.stage(a.projection.save, encode_npy_f32({w.m(), w.d()}, w.data()),
                      "--save-projection");
      }
    }
    const Shape4& qs = s->qf.shape;
    const std::vector<int64_t> out_shape =
        s->qf.rank == 2 ? std::vector<int64_t>{qs[2], s->vf.shape[3]}
                        : std::vector<int64_t>{qs[0], qs[1], qs[2], s->vf.shape[3]};
    const char no_data = 0;  // the header alone: the ranks write the data
    header = encode_npy("<f4", out_shape, &no_data, 0);
    y = output_rows(*s);
  });
  if (!a.key_mask.empty()) {
    o.key_mask = KeyMaskView::contiguous(s->mask.data(), s->kf.shape[0], s->ks.size());
    vo.key_mask = o.key_mask;
  }
  ex.reset_counters();
  SequenceParallelStats st;
  try {
    st = vq ? sequence_parallel_vq_attention(s->q, s->k, s->v, codebook, y.mutable_view(), vo, ex)
            : sequence_parallel_attention(s->q, s->k, s->v, *map, y.mutable_view(), o, ex);
  } catch (const Error& e) {
    // The library agrees on its errors (a rank's inputs refused, ranks that disagree): every
    // rank throws this one. Anything else (out of memory) is this rank's alone.
    throw AgreedError(e.what());
  }
  const double seconds = ex.seconds();
  const int64_t bytes = ex.bytes();

  together(ex, [&] {
    if (ex.rank() == 0) outputs.stage(a.out, header, "--out");
  });
  OutputFile file(ex.allgather_text(ex.rank() == 0 ? outputs.last_temp() : "")[0]);
  together(ex, [&] { file.open(); });
  together(ex, [&] {
    file.write_rows(header.size(), y, s->qs, s->qf.shape[2]);
    file.close();
  });
  together(ex, [&] {
    if (ex.rank() == 0) outputs.commit();
  });
  print_summary(a, ex, *s, st, seconds, bytes);
}

// Ends the job after an error that the other ranks may not have seen: they may be waiting for
// this rank in a collective (and MPI_Finalize would wait for them), so this rank prints it.
[[noreturn]] void abort_job(const std::exception& e, int rank, int size) {
  const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  std::cerr << "favor: error: " << (oom ? std::string("out of memory") : terminal_safe(e.what()))
            << " (rank " << rank << " of " << size << "; ending the job)" << std::endl;
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();  // MPI_Abort does not return
}

}  // namespace

void run_distributed_attention(const AttentionArgs& a) {
  MpiSession session;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    distributed::MpiExchange ex(MPI_COMM_WORLD);
    try {
      run(a, ex);
    } catch (const AgreedError&) {
      throw;
    } catch (const std::exception& e) {
      abort_job(e, rank, size);  // before ex's destructor, which frees communicators
    }
  } catch (const AgreedError& e) {
    // Every rank has the same error. Rank 0 prints it now, before MPI_Finalize: mpirun may
    // end the job as soon as a rank has exited with a nonzero code.
    if (rank == 0) std::cerr << "favor: error: " << terminal_safe(e.what()) << std::endl;
    throw AlreadyReported();
  } catch (const std::exception& e) {
    abort_job(e, rank, size);  // MpiExchange's constructor
  }
}

}  // namespace favor::cli
