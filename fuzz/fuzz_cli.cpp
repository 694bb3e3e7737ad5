// Fuzz target: the favor CLI's argument and option parsing. The input is an argv (elements
// separated by NUL bytes, argv[0] implied); it is parsed by the same CLI::App as the tool
// (tools/commands.cpp), and the callbacks of attention, features, codebook and fit run, so every
// check of their options and of the files they name happens. They read small valid .npy /
// .npz files made in a per-process scratch directory (q.npy, k.npy, v.npy: [1, 2, 4, 3];
// q2.npy, k2.npy, v2.npy: [4, 3]; mask.npy [1, 4] and mask2.npy [4] (bool); w.npy [4, 3] (a
// projection); cb.npy [2, 3] and cb3.npy [2, 2, 3] (codebooks); lw.npy [4] (feature weights);
// map.npz (a fitted map, D = 3, m = 4, 2 heads); f64.npy [4, 3] float64). The commands run
// with that directory as the working directory (outputs land there); it is emptied and the
// files remade before every input.
// What is filtered (the input is skipped, as a no-op):
//  - an element containing '/' or "..": a fuzzed argv must not read or write outside the
//    scratch directory (every file it may name is in it);
//  - an element, or a piece of it between '=' or ',', that is an integer (as CLI11 reads
//    them: strtoll base 0) of magnitude above 64: --features, --steps, --codes,
//    --iterations, --threads ... would otherwise ask for unbounded work;
//  - more than 64 elements.
// And `favor fit` without --steps gets --steps=4 (its default, 200 steps, is slow here).
// The callbacks of demo, bench and accuracy do not run: the parse stops after their options
// are converted and checked (their sweeps are synthetic workloads, and bench / accuracy
// --plot start Python).
// Every input must parse, or fail with CLI::Error (what main prints as a usage error) or
// favor::Error with a printable message (argv bytes escaped); any other exception is a
// finding, and so are crashes, leaks and UB.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "favor/favor.hpp"
#include "fuzz_support.hpp"
#include "map_file.hpp"
#include "npy.hpp"
#include "printable.hpp"

namespace {

constexpr size_t kMaxArgs = 64;
constexpr long long kMaxNumber = 64;

struct File {
  std::string name, bytes;
};

std::string f32(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>((i * 7) % 11) - 1.0f;
  return favor::io::encode_npy_f32(shape, x.data());
}

std::vector<File> make_files() {
  std::vector<File> files;
  for (const char* n : {"q", "k", "v"}) {
    files.push_back({std::string(n) + ".npy", f32({1, 2, 4, 3})});
    files.push_back({std::string(n) + "2.npy", f32({4, 3})});
  }
  const uint8_t mask[4] = {1, 0, 1, 1};
  files.push_back({"mask.npy", favor::io::encode_npy("|b1", {1, 4}, mask, 4)});
  files.push_back({"mask2.npy", favor::io::encode_npy("|b1", {4}, mask, 4)});
  files.push_back({"w.npy", f32({4, 3})});
  files.push_back({"cb.npy", f32({2, 3})});
  files.push_back({"cb3.npy", f32({2, 2, 3})});
  const float lw[4] = {1.0f, 0.5f, 2.0f, -1.0f};
  files.push_back({"lw.npy", favor::io::encode_npy_f32({4}, lw)});
  std::vector<double> d(12);
  for (size_t i = 0; i < d.size(); ++i) d[i] = 0.1 * static_cast<double>(i) - 0.5;
  files.push_back({"f64.npy", favor::io::encode_npy("<f8", {4, 3}, d.data(), d.size() * 8)});
  favor::FeatureMap map(favor::Projection::draw(4, 3, {}), favor::Kernel::positive);
  map.learnable(2);
  files.push_back({"map.npz", favor::io::encode_map_file(map)});
  return files;
}

const std::vector<File>& files() {
  static const std::vector<File> made = make_files();
  return made;
}

/// Empties the scratch directory (outputs of the last input) and writes the inputs again,
/// when something was written there since the last reset (outputs are renamed into place,
/// which changes the directory's mtime).
void reset_directory() {
  static timespec last{-1, 0};
  struct stat st {};
  if (stat(favor::fuzz::scratch_dir().c_str(), &st) == 0 && st.st_mtim.tv_sec == last.tv_sec &&
      st.st_mtim.tv_nsec == last.tv_nsec)
    return;
  std::error_code ignored;
  for (const auto& e : std::filesystem::directory_iterator(favor::fuzz::scratch_dir(), ignored))
    std::filesystem::remove_all(e.path(), ignored);
  for (const File& f : files()) favor::fuzz::write_scratch(f.name, f.bytes);
  if (stat(favor::fuzz::scratch_dir().c_str(), &st) == 0) last = st.st_mtim;
}

/// `favor fit` trains 200 Adam steps by default: without --steps, the target gives it 4.
void bound_fit(std::vector<std::string>& args) {
  const size_t command = args.size() > 2 && args[0] == "--threads" ? 2 : 0;
  if (args.size() <= command || args[command] != "fit") return;
  for (const std::string& a : args)
    if (a.rfind("--steps", 0) == 0) return;
  args.push_back("--steps=4");
}

bool too_big(const std::string& piece) {
  if (piece.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(piece.c_str(), &end, 0);
  if (end == piece.c_str()) return false;
  return errno == ERANGE || v > kMaxNumber || v < -kMaxNumber;
}

/// Whether the argv is one the target runs (see the filters above).
bool allowed(const std::vector<std::string>& args) {
  if (args.size() > kMaxArgs) return false;
  for (const std::string& a : args) {
    if (a.find('/') != std::string::npos || a.find("..") != std::string::npos) return false;
    size_t start = 0;
    while (true) {
      const size_t stop = a.find_first_of("=,", start);
      if (too_big(a.substr(start, stop == std::string::npos ? std::string::npos : stop - start)))
        return false;
      if (stop == std::string::npos) break;
      start = stop + 1;
    }
  }
  return true;
}

/// Thrown to leave the parse before a skipped subcommand's callback.
struct Skipped {};

/// The app of the favor tool (run_command_line, tools/commands.cpp).
void parse(std::vector<std::string> args) {
  bool printable_args = true;
  for (const std::string& a : args)
    for (const char c : a) printable_args = printable_args && c >= 0x20 && c <= 0x7e;
  CLI::App app{"favor"};
  std::optional<int> threads;
  favor::cli::add_commands(app, threads);
  // Runs after every option is converted and checked, before the subcommands' callbacks.
  app.parse_complete_callback([&app, &threads] {
    if (threads) favor::set_num_threads(*threads);
    for (const char* skipped : {"demo", "bench", "accuracy"})
      if (app.got_subcommand(skipped)) throw Skipped{};
  });
  std::vector<char*> argv{const_cast<char*>("favor")};
  for (std::string& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Error&) {  // usage errors, --help, --version
  } catch (const favor::Error& e) {
    // Bytes of a file are escaped where they are quoted; a path the user typed is quoted as
    // typed (a UTF-8 name stays readable) and made safe where run_command_line prints the line
    // (terminal_safe). So: printable ASCII for printable argvs; for any argv, the printed line
    // holds no control byte and only valid UTF-8
    // (regressions/cli/unescaped_path_in_message.argv).
    if (printable_args) favor::fuzz::require_printable("fuzz_cli", e.what());
    favor::fuzz::require_terminal_safe("fuzz_cli", favor::io::terminal_safe(e.what()));
  } catch (const Skipped&) {
  }
}

}  // namespace

/// Runs the commands inside the scratch directory, and returns to the directory libFuzzer
/// writes its corpus and crashes in (paths given to it may be relative).
class InScratch {
 public:
  InScratch() : back_(std::filesystem::current_path()) { go(favor::fuzz::scratch_dir()); }
  ~InScratch() { go(back_); }

 private:
  static void go(const std::filesystem::path& dir) {
    if (chdir(dir.c_str()) != 0) {
      std::perror("fuzz_cli: chdir");
      std::abort();
    }
  }
  std::filesystem::path back_;
};

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The commands print tables and notes: not needed here.
  if (!std::freopen("/dev/null", "w", stdout)) std::perror("fuzz_cli: stdout");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  if (size) {
    std::string element;
    for (size_t i = 0; i < size; ++i) {
      if (data[i] == 0)
        args.push_back(std::move(element)), element.clear();
      else
        element.push_back(static_cast<char>(data[i]));
    }
    args.push_back(std::move(element));
  }
  if (!allowed(args)) return 0;
  bound_fit(args);
  reset_directory();
  favor::set_num_threads(1);
  const InScratch here;
  try {
    parse(std::move(args));
  } catch (const std::exception& e) {
    favor::fuzz::unexpected_exception("fuzz_cli", e.what());
  }
  return 0;
}
