#include "fuzz_support.hpp"

#include "printable.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "favor/error.hpp"

namespace favor::fuzz {
namespace {

struct Scratch {
  std::string path;
  Scratch() {
    // Memory-backed /dev/shm where there is one: the targets write files on every input, and
    // creating, fsyncing and deleting them on a disk costs more than the code under test.
    const char* env = std::getenv("FAVOR_FUZZ_TMPDIR");
    const std::string base = env && *env                            ? env
                             : access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm"
                                                                    : "/tmp";
    std::string pattern = base + "/favor-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("favor fuzz: mkdtemp");
      std::abort();
    }
    path = pattern;
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static const Scratch scratch;
  return scratch.path;
}

std::string write_scratch(const std::string& name, const std::string& bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "favor fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

void unexpected_exception(const char* target, const char* what) {
  std::fprintf(stderr, "%s: an exception other than favor::Error escaped: %s\n", target, what);
  std::abort();
}

void require_printable(const char* target, const char* message) {
  for (const char* c = message; *c; ++c) {
    const auto byte = static_cast<unsigned char>(*c);
    if (byte < 0x20 || byte > 0x7e) {
      std::fprintf(stderr, "%s: byte 0x%02x unescaped at %zu of the message: %s\n", target, byte,
                   static_cast<size_t>(c - message), message);
      std::abort();
    }
  }
}

void require_terminal_safe(const char* target, const std::string& line) {
  for (const char c : line) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      std::fprintf(stderr, "%s: control byte 0x%02x in the printed line: %s\n", target, byte,
                   line.c_str());
      std::abort();
    }
  }
  if (favor::io::terminal_safe(line) != line) {
    std::fprintf(stderr, "%s: broken UTF-8 in the printed line: %s\n", target, line.c_str());
    std::abort();
  }
}

}  // namespace favor::fuzz
