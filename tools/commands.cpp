#include "commands.hpp"

#include <iostream>
#include <string>

#include "command_line.hpp"
#include "favor/favor.hpp"
#include "io_names.hpp"

namespace favor::cli {

void add_commands(CLI::App& app, std::optional<int>& threads) {
  // The version and what the build runs with (SIMD target, BLAS, bf16: favor::build_info()).
  app.set_version_flag("--version", [] { return build_info(); });
  app.require_subcommand(1);
  app.fallthrough();  // --threads is accepted after the subcommand too
  app.add_option("--threads", threads, "threads to use (default: FAVOR_NUM_THREADS or all cores)");
  add_demo_command(app);
  add_attention_command(app);
  add_features_command(app);
  add_bench_command(app);
  add_accuracy_command(app);
  add_codebook_command(app);
  add_fit_command(app);
}

int run_command_line(int argc, char** argv) {
  // Named "favor" here, not after argv[0]: the usage lines read "favor ..." whether the binary
  // runs as build/tools/favor or as the wheel's favor/_bin/favor behind the console script.
  CLI::App app{"favor: fast random-feature attention (FAVOR+) and exact attention on .npy arrays",
               "favor"};
  std::optional<int> threads;
  add_commands(app, threads);
  app.parse_complete_callback([&threads] {
    if (threads) set_num_threads(*threads);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "favor: error: " << io::terminal_safe(e.what()) << " (see favor --help)\n";
    return 2;
  } catch (const AlreadyReported&) {  // favor attention --distributed
    return 2;
  } catch (const Error& e) {
    std::cerr << "favor: error: " << io::terminal_safe(e.what()) << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "favor: error: " << io::terminal_safe(e.what()) << '\n';
    return 2;
  }
  return 0;
}

}  // namespace favor::cli
