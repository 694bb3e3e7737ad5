#pragma once
// The favor subcommands. Each registers itself on the app; its callback does the work and
// throws favor::Error on bad input (main turns that into one line and exit code 2).
#include <CLI/CLI.hpp>

namespace favor::cli {

void add_demo_command(CLI::App& app);
void add_attention_command(CLI::App& app);
void add_features_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_accuracy_command(CLI::App& app);
void add_codebook_command(CLI::App& app);
void add_fit_command(CLI::App& app);

}  // namespace favor::cli
