// Replays fuzz inputs without libFuzzer (the CTest fuzz_replay_<target>): every file named
// on the command line, or found (recursively) in a directory named there, goes through the
// target's LLVMFuzzerTestOneInput once. A crash aborts the test; it prints the count.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

int replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return 1;
  }
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
  // A copy of exactly `size` bytes, as libFuzzer gives, so ASan sees reads past the end.
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(copy.data(), copy.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int files = 0, failures = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg = argv[i];
    if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> found;
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg))
        if (e.is_regular_file() && e.path().filename() != "README.md") found.push_back(e.path());
      std::sort(found.begin(), found.end());
      for (const auto& f : found) failures += replay(f), ++files;
    } else if (std::filesystem::exists(arg)) {
      failures += replay(arg), ++files;
    } else {
      std::fprintf(stderr, "replay: %s does not exist\n", arg.c_str());
      ++failures;
    }
  }
  std::printf("replay: %d inputs, %d unreadable\n", files, failures);
  return failures == 0 ? 0 : 1;
}
