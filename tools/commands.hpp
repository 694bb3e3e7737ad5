#pragma once
// The favor subcommands. Each registers itself on the app; its callback does the work and
// throws favor::Error on bad input (main turns that into one line and exit code 2).
#include <CLI/CLI.hpp>
#include <exception>
#include <optional>

namespace favor::cli {

/// Thrown by every rank of a distributed command that failed on some rank: rank 0 has printed
/// the one error line already (before MPI_Finalize), so every rank exits with code 2 silently.
struct AlreadyReported : std::exception {
  const char* what() const noexcept override { return "failed (reported by rank 0)"; }
};

void add_demo_command(CLI::App& app);
void add_attention_command(CLI::App& app);
void add_features_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_accuracy_command(CLI::App& app);
void add_codebook_command(CLI::App& app);
void add_fit_command(CLI::App& app);

/// The whole command line of `favor` (run_command_line; fuzz/fuzz_cli.cpp parses the same):
/// --version, --threads (into `threads`, before or after the subcommand), exactly one
/// subcommand, every subcommand above.
void add_commands(CLI::App& app, std::optional<int>& threads);

}  // namespace favor::cli
