#pragma once
// Draws a plot with one of favor's matplotlib scripts (plot_bench.py, plot_accuracy.py)
// through Debian's /usr/bin/python3 (FAVOR_PYTHON overrides), into a staged output.
#include <initializer_list>
#include <string>

#include "io_names.hpp"

namespace favor::cli {

/// The first readable script: $env_var if set, else the candidates in order (installed,
/// then source tree). Throws favor::Error naming --plot when none is found.
std::string find_plot_script(const char* env_var, std::initializer_list<const char*> candidates,
                             const std::string& name);
/// Writes `json_text` to a temporary file, stages `plot` in `outputs` and runs
/// `python script json staged_png`. Throws favor::Error naming --plot, with the script's
/// last stderr line, when it fails (the staged file is then discarded with `outputs`).
void draw_plot(const std::string& script, const std::string& json_text, const std::string& plot,
               StagedOutputs& outputs);

}  // namespace favor::cli
