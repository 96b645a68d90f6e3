// attnlab: list, run and verify attention kernels (and sweep, peak, merge).
#include <iostream>

#include "common.hpp"

int main(int argc, char** argv) {
  using namespace attnlab;
  CLI::App app{"attnlab: a performance lab for scaled-dot-product attention"};
  app.require_subcommand(1);
  std::vector<cli::Command> commands = {
      cli::add_list(app),  cli::add_run(app),   cli::add_verify(app), cli::add_peak(app),
      cli::add_sweep(app), cli::add_merge(app), cli::add_cuda(app),   cli::add_generate(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    for (auto& c : commands) {
      if (c.app->parsed()) return c.run();
    }
  } catch (const InvalidInput& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const IoError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  }
  return 2;
}
