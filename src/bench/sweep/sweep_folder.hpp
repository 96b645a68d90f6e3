// Where a sweep writes and whether it may resume there: the folder's name (a dated default,
// numbered on; the newest matching folder on --resume), the shard argument, and the check that
// a resumed folder was measured by this same build.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace attnlab::bench {

struct SweepOptions;

// "i/n" -> {i, n} with 0 <= i < n; throws InvalidInput naming the allowed form.
std::pair<int, int> parse_shard(const std::string& text);

// o.out_dir when set; on o.resume the newest folder of this experiment and shard under
// o.results_root (by sweep.json's creation time, then the name's date and number); else a new
// <results_root>/<date>-<experiment>[-shardIofN][-N].
std::string choose_out_dir(const std::string& experiment, const SweepOptions& o);

// The build a folder's points were measured with must be this one: points of two commits
// or two sets of compiler flags in one folder would be compared as if they were one run.
// Returns the record of a forced resume (null when the builds match).
nlohmann::json check_same_build(const std::string& dir, const nlohmann::json& old_machine, bool force,
                                std::ostream& log);

}  // namespace attnlab::bench
