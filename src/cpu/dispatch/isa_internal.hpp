// The built targets' tables (src/cpu/dispatch/target.hpp), for the registry and `attnlab peak`.
#pragma once

#include <string_view>
#include <vector>

#include "cpu/dispatch/target.hpp"

namespace attnlab {

// Every built target's table, narrowest first.
const std::vector<const TargetTable*>& target_tables();
// The table of a built target, nullptr when the build has none of that name.
const TargetTable* target_table_for(std::string_view isa);
// The avx512_bf16 object's table, nullptr when the build has none (whether this CPU runs it:
// cpu_runs_isa(kBf16Isa)).
const Bf16Table* bf16_table();

}  // namespace attnlab
