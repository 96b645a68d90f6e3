// libFuzzer entry point of one target: CMake compiles this file once per target with
// ATTN_FUZZ_CHECK set to the check it runs (targets.hpp).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken =
      attnlab::fuzz::ATTN_FUZZ_CHECK(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz: contract broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
