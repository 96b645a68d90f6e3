// The value grammar of the lab's inputs: what an experiment key, a CLI flag or a Python
// keyword may hold (integers, lists, {"pow2": ...}, names), and the errors that name the
// source, the key, the bad value and what is allowed. The point schema's axes
// (point_schema.hpp) parse with these; so does the experiment reader for its run keys.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/problem.hpp"

namespace attnlab::schema {

using Json = nlohmann::json;

// Bounds on what one key can ask for, so a hostile file is an error, not an endless loop.
inline constexpr int64_t kMaxListLength = 4096;  // values of one key (after expanding pow2 / range)

inline constexpr const char* kIntsAllowed =
    "a positive integer, a list of them, {\"pow2\": [lo, hi]} (powers of two, lo <= hi) or "
    "{\"range\": [start, stop, step]} (stop inclusive, step >= 1)";

// Where values come from, for the errors: an experiment file ("experiment F: key 'k': bad
// value V; allowed: A"), or the command line or a call (`source` names it; the key is then
// written as given: "--dtype" or "dtype").
struct Where {
  Where(std::string file_, std::string source_ = "", bool flags_ = false)
      : file(std::move(file_)), source(std::move(source_)), flags(flags_) {}
  std::string file;    // experiment name (with " grids[i]" inside a grid entry)
  std::string source;  // non-empty: "command line" or "attnlab.attention", instead of the file
  bool flags = false;  // keys as CLI flags ("kv_dtype" -> "--kv-dtype")
  [[noreturn]] void bad(const std::string& key, const Json& value, const std::string& allowed) const;
  [[noreturn]] void fail(const std::string& what) const;
  std::string prefix() const;  // "experiment F" or `source`
};

std::string join(const std::vector<std::string>& v);
// "kv_dtype" -> "--kv-dtype".
std::string flag_of(const std::string& key);

// An integer that fits int64 (nlohmann keeps larger ones as uint64).
bool is_int(const Json& v);
// A list under `key` may not have more than kMaxListLength values; `count` is how many it has.
void check_list_length(const Where& w, const std::string& key, const Json& v, uint64_t count);

// INTS (kIntsAllowed), each value >= min_value; duplicates dropped, order kept.
std::vector<int64_t> parse_ints(const Where& w, const std::string& key, const Json& v, int64_t min_value);
// NAME | [NAME, ...] with each NAME one of `names`; duplicates dropped, order kept.
std::vector<std::string> parse_names(const Where& w, const std::string& key, const Json& v,
                                     const std::vector<std::string>& names);
// A list of values, each checked by `one` (which calls w.bad); a scalar is a one-value list.
template <class One>
std::vector<Json> parse_list(const Where& w, const std::string& key, const Json& v, const std::string& allowed,
                             One one) {
  std::vector<Json> out;
  if (v.is_array()) {
    if (v.empty()) w.bad(key, v, allowed + " (not an empty list)");
    check_list_length(w, key, v, v.size());
    for (const Json& x : v) out.push_back(one(x));
  } else {
    out.push_back(one(v));
  }
  return out;
}

int64_t parse_one_int(const Where& w, const std::string& key, const Json& v, int64_t min_value,
                      const std::string& allowed);
double parse_positive(const Where& w, const std::string& key, const Json& v);
int64_t parse_int_at_least(const Where& w, const std::string& key, const Json& v, int64_t lo, int64_t hi);

// A flag's text as a value: "a,b" is a list; each item an integer, a real number, true/false, null,
// or a name.
Json json_of_flag_text(const std::string& text);

}  // namespace attnlab::schema
