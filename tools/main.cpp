// The favor command-line tool. Every failure prints one line "favor: error: ..." on
// stderr (control bytes and broken UTF-8 escaped) and exits with code 2, writing no output
// file. The parsing and the error handling are favor::cli::run_command_line (commands.cpp).
#include "command_line.hpp"

int main(int argc, char** argv) { return favor::cli::run_command_line(argc, argv); }
