#pragma once
// The favor command line as a function (tools/commands.cpp). Apart from commands.hpp so that
// tools/main.cpp does not compile CLI11's header once more (its validators cost ~8 s of g++ -O3
// per including file; the CLI's own files compile it once per unity batch).

namespace favor::cli {

/// Parses argv and runs the subcommand. Every failure prints one line "favor: error: ..." on
/// stderr (control bytes and broken UTF-8 escaped) and returns 2; --help and --version 0.
int run_command_line(int argc, char** argv);

}  // namespace favor::cli
