#pragma once
// favor's Python scripts, run through the project venv's interpreter (FAVOR_PYTHON overrides):
// the matplotlib plots (plot_bench.py, plot_accuracy.py) into a staged output, and the sgemm
// rates of numpy's and torch's BLAS (sgemm_peers.py) for favor bench's yardstick.
#include <cstdint>
#include <string>

#include "io_names.hpp"

namespace favor::cli {

/// plot_bench.py and plot_accuracy.py: the first readable of $FAVOR_PLOT_SCRIPT
/// (FAVOR_ACCURACY_PLOT_SCRIPT), the installed copy, the source tree's. Throws favor::Error
/// naming --plot when none is found. The build-time paths live in plot_runner.cpp only.
std::string bench_plot_script();
std::string accuracy_plot_script();
/// Writes `json_text` to a temporary file, stages `plot` in `outputs` and runs
/// `python script json staged_png`. Throws favor::Error naming --plot, with the script's
/// last stderr line, when it fails (the staged file is then discarded with `outputs`).
void draw_plot(const std::string& script, const std::string& json_text, const std::string& plot,
               StagedOutputs& outputs);

/// sgemm_peers.py's JSON ({"numpy": {"gflops", "blas"}, "torch": {...}}) for an n^3 sgemm on
/// `threads` threads, or "" when the script or its interpreter cannot run (no peers then).
std::string sgemm_peers_json(int64_t n, int threads, int repeats, double min_time);

}  // namespace favor::cli
