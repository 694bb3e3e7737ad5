#include "commands.hpp"

#include <string>

#include "favor/favor.hpp"

namespace favor::cli {

void add_commands(CLI::App& app, std::optional<int>& threads) {
  app.set_version_flag("--version", std::string("favor ") + FAVOR_VERSION_STRING);
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

}  // namespace favor::cli
