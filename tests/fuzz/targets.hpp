// The fuzz targets' bodies, shared by the libFuzzer entry point (fuzz_main.cpp, one binary per
// target) and the corpus replay test (tests/bench/test_fuzz_corpus.cpp, every build), so each input
// that once crashed stays a regression test in the ordinary suite.
//
// Each check feeds one input to a parser the way the lab does and returns "" when the input
// is handled as the contract says, else what broke. The contract: bad input throws
// InvalidInput (or, for command-line flags, CLI::ParseError) and nothing else; any other
// exception escapes the check (libFuzzer reports it as a crash, the test as a failure).
#pragma once

#include <string>
#include <string_view>

namespace attnlab::fuzz {

// .npy bytes through parse_npy (read_npy's core). An accepted array has as many elements as
// its shape says, and encoding it back parses to the same array.
std::string check_npy(std::string_view bytes);

// Experiment JSON text through parse_experiment_text (load_experiment's core), which also
// expands and validates every grid point (bounded: a hang or a blow-up is a finding through
// libFuzzer's -timeout and -rss_limit_mb).
std::string check_experiment(std::string_view text);

// Command-line arguments, one per line, through `attnlab verify`'s shape and mask flags
// (ShapeFlags, MaskFlags), Problem::validate and the visible-key rule: every row's interval
// lies in [0, kv_len], moves monotonically with the row, and equals the rule evaluated in
// exact 128-bit arithmetic (a window bound past the first or last key meaning unbounded).
std::string check_mask_flags(std::string_view args);

}  // namespace attnlab::fuzz
