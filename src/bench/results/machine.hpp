// What a result depends on besides the code: CPU, ISA, compiler and flags, library
// versions, git commit, measured peaks. Written as machine.json beside every sweep and added
// to Google Benchmark's JSON context.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/using.hpp"

namespace attnlab::bench {

// CPU model, cores, memory, OS, SIMD arch, compiler, flags, build type, library versions,
// git commit (and whether the tree had uncommitted changes), kernels in the registry.
nlohmann::json describe_machine();

// describe_machine() plus "peaks": peaks.to_json().
nlohmann::json describe_machine(const Peaks& peaks);

// Adds the main fields (and the peaks per thread count) to Google Benchmark's context.
// Call once per process, before the first RunSpecifiedBenchmarks.
void add_benchmark_context(const nlohmann::json& machine);

// Physical memory in bytes (0 when unknown).
size_t physical_memory_bytes();

// Today's date as YYYY-MM-DD (local time) and an ISO 8601 timestamp.
std::string today();
std::string now_iso8601();

}  // namespace attnlab::bench
