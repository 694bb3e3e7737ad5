#pragma once
// The sections of `favor bench` (--sections): a table of name -> function + description.
// Each section lives in a file of its own (tools/bench_<what>.cpp) and appends its rows
// through the BenchRunner; adding a section is adding its file and its line in the table
// (tools/bench_sections.cpp).
#include <string>
#include <vector>

namespace favor::cli {

class BenchRunner;

struct BenchSection {
  const char* name;
  void (*run)(BenchRunner& bench);
  const char* description;  ///< for --help, after the name
};

/// Every section, in the order in which they run (whatever the order of --sections).
const std::vector<BenchSection>& bench_sections();

/// --sections' help: each section with its description, and those not run by default.
std::string bench_sections_help(const std::vector<std::string>& defaults);

}  // namespace favor::cli
