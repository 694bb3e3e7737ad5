#pragma once
// Draws a plot with one of favor's matplotlib scripts (plot_bench.py, plot_accuracy.py)
// through Debian's /usr/bin/python3 (FAVOR_PYTHON overrides), into a staged output.
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

}  // namespace favor::cli
