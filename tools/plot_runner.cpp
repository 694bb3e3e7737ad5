#include "plot_runner.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>

#include "favor/error.hpp"

// FAVOR_PYTHON and the scripts' paths are defined for this file alone (tools/CMakeLists.txt):
// they name places in the source, build and install trees, and on every other file's command
// line they would stop the pip-install test's compiles from hitting the compiler cache.
namespace favor::cli {
namespace {

std::string python_interpreter() {
  const char* env = std::getenv("FAVOR_PYTHON");
  return env && *env ? env : FAVOR_PYTHON;
}

/// The first readable script: $env_var if set, else the candidates in order (installed,
/// then source tree).
std::string find_plot_script(const char* env_var, std::initializer_list<const char*> candidates,
                             const std::string& name) {
  const char* env = std::getenv(env_var);
  if (env && *env) return env;
  for (const char* candidate : candidates) {
    if (::access(candidate, R_OK) == 0) return candidate;
  }
  throw Error("--plot: " + name + " not found (set " + env_var + ")");
}

}  // namespace

std::string bench_plot_script() {
  return find_plot_script("FAVOR_PLOT_SCRIPT",
                          {FAVOR_PLOT_SCRIPT_INSTALLED, FAVOR_PLOT_SCRIPT_SOURCE}, "plot_bench.py");
}

std::string accuracy_plot_script() {
  return find_plot_script("FAVOR_ACCURACY_PLOT_SCRIPT",
                          {FAVOR_ACCURACY_PLOT_INSTALLED, FAVOR_ACCURACY_PLOT_SOURCE},
                          "plot_accuracy.py");
}

std::string sgemm_peers_json(int64_t n, int threads, int repeats, double min_time) {
  std::string script;
  for (const char* candidate : {FAVOR_SGEMM_PEERS_INSTALLED, FAVOR_SGEMM_PEERS_SOURCE}) {
    if (::access(candidate, R_OK) == 0) {
      script = candidate;
      break;
    }
  }
  if (script.empty()) return "";
  const std::string cmd = python_interpreter() + " '" + script + "' " + std::to_string(n) + " " +
                          std::to_string(threads) + " " + std::to_string(repeats) + " " +
                          std::to_string(min_time) + " 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buf[512];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, got);
  return ::pclose(pipe) == 0 ? out : "";
}

void draw_plot(const std::string& script, const std::string& json_text, const std::string& plot,
               StagedOutputs& outputs) {
  char json_path[] = "/tmp/favor-plot-XXXXXX";
  const int fd = mkstemp(json_path);
  if (fd < 0) throw Error("--plot: cannot create a temporary file");
  ::close(fd);
  std::ofstream(json_path) << json_text;
  outputs.stage(plot, "", "--plot");
  const std::string log_path = std::string(json_path) + ".log";
  const std::string cmd = python_interpreter() + " '" + script + "' '" + json_path + "' '" +
                          outputs.last_temp() + "' 2>'" + log_path + "'";
  const int rc = std::system(cmd.c_str());
  std::string last_line;  // the script's own last word on stderr, for the one-line error
  {
    std::ifstream log(log_path);
    for (std::string line; std::getline(log, line);) {
      if (!line.empty()) last_line = line;
    }
  }
  std::remove(json_path);
  std::remove(log_path.c_str());
  if (rc != 0) {
    throw Error("--plot: " + plot + ": the plot script " + script + " failed" +
                (last_line.empty() ? std::string() : ": " + last_line));
  }
}

}  // namespace favor::cli
