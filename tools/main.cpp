// The favor command-line tool. Every failure prints one line "favor: error: ..." on
// stderr (control bytes and broken UTF-8 escaped) and exits with code 2, writing no output
// file.
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "commands.hpp"
#include "favor/favor.hpp"
#include "io_names.hpp"

int main(int argc, char** argv) {
  CLI::App app{"favor: fast random-feature attention (FAVOR+) and exact attention on .npy arrays"};
  std::optional<int> threads;
  favor::cli::add_commands(app, threads);
  app.parse_complete_callback([&threads] {
    if (threads) favor::set_num_threads(*threads);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "favor: error: " << favor::io::terminal_safe(e.what()) << " (see favor --help)\n";
    return 2;
  } catch (const favor::cli::AlreadyReported&) {  // favor attention --distributed
    return 2;
  } catch (const favor::Error& e) {
    std::cerr << "favor: error: " << favor::io::terminal_safe(e.what()) << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "favor: error: " << favor::io::terminal_safe(e.what()) << '\n';
    return 2;
  }
  return 0;
}
