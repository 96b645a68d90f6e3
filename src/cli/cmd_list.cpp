// attnlab list: every kernel, what it is, whether it can run here.
#include <iomanip>
#include <iostream>

#include "attnlab/kernel.hpp"
#include "common.hpp"

namespace attnlab::cli {

Command add_list(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("list", "list the kernels and whether each is available here");
  return {sub, [] {
            std::cout << std::left << std::setw(12) << "kernel" << std::setw(16) << "available"
                      << "description\n";
            for (const Kernel* k : registry()) {
              const Support a = k->available();
              std::cout << std::left << std::setw(12) << k->name()
                        << std::setw(16) << (a ? "yes" : "no") << k->description();
              if (!a) std::cout << "  [unavailable: " << a.reason << "]";
              std::cout << "\n";
            }
            return 0;
          }};
}

}  // namespace attnlab::cli
