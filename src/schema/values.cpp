#include "schema/values.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace attnlab::schema {

std::string Where::prefix() const { return source.empty() ? "experiment " + file : source; }

void Where::bad(const std::string& key, const Json& value, const std::string& allowed) const {
  const std::string named = flags ? flag_of(key) : "key '" + key + "'";
  // A command line's text may be any bytes: written with invalid UTF-8 replaced, never thrown on.
  const std::string shown = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  throw InvalidInput(prefix() + ": " + named + ": bad value " + shown + "; allowed: " + allowed);
}

void Where::fail(const std::string& what) const { throw InvalidInput(prefix() + ": " + what); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string flag_of(const std::string& key) {
  std::string f = "--" + key;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

bool is_int(const Json& v) {
  return v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
}

void check_list_length(const Where& w, const std::string& key, const Json& v, uint64_t count) {
  if (count > static_cast<uint64_t>(kMaxListLength)) {
    w.bad(key, v,
          "at most " + std::to_string(kMaxListLength) + " values per key (this gives " + std::to_string(count) + ")");
  }
}

namespace {
bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
}  // namespace

std::vector<int64_t> parse_ints(const Where& w, const std::string& key, const Json& v, int64_t min_value) {
  const std::string allowed = std::string(kIntsAllowed) + ", each >= " + std::to_string(min_value);
  std::vector<int64_t> out;
  auto take = [&](const Json& x) {
    if (!is_int(x) || x.get<int64_t>() < min_value) w.bad(key, v, allowed);
    out.push_back(x.get<int64_t>());
  };
  if (is_int(v)) {
    take(v);
  } else if (v.is_array()) {
    if (v.empty()) w.bad(key, v, allowed + " (not an empty list)");
    check_list_length(w, key, v, v.size());
    for (const auto& x : v) take(x);
  } else if (v.is_object() && v.size() == 1 && v.contains("pow2")) {
    const Json& a = v["pow2"];
    if (!a.is_array() || a.size() != 2 || !is_int(a[0]) || !is_int(a[1])) w.bad(key, v, allowed);
    const int64_t lo = a[0].get<int64_t>(), hi = a[1].get<int64_t>();
    if (!is_pow2(lo) || !is_pow2(hi) || lo > hi || lo < min_value) w.bad(key, v, allowed);
    // x <= hi / 2 before doubling: 2 * x never passes INT64_MAX.
    for (int64_t x = lo;; x *= 2) {
      out.push_back(x);
      if (x > hi / 2) break;
    }
  } else if (v.is_object() && v.size() == 1 && v.contains("range")) {
    const Json& a = v["range"];
    if (!a.is_array() || a.size() != 3 || !is_int(a[0]) || !is_int(a[1]) || !is_int(a[2])) w.bad(key, v, allowed);
    const int64_t start = a[0].get<int64_t>(), stop = a[1].get<int64_t>(), step = a[2].get<int64_t>();
    if (step < 1 || start > stop || start < min_value) w.bad(key, v, allowed);
    // start >= 0 here, so stop - start cannot wrap; values are start + n * step, never summed past stop.
    const uint64_t count = static_cast<uint64_t>((stop - start) / step) + 1;
    check_list_length(w, key, v, count);
    for (uint64_t n = 0; n < count; ++n) out.push_back(start + static_cast<int64_t>(n) * step);
  } else {
    w.bad(key, v, allowed);
  }
  std::vector<int64_t> unique;
  for (int64_t x : out) {
    if (std::find(unique.begin(), unique.end(), x) == unique.end()) unique.push_back(x);
  }
  return unique;
}

std::vector<std::string> parse_names(const Where& w, const std::string& key, const Json& v,
                                     const std::vector<std::string>& names) {
  std::string allowed;
  for (const auto& n : names) allowed += (allowed.empty() ? "\"" : ", \"") + n + "\"";
  allowed += ", or a list of these";
  std::vector<std::string> out;
  for (const Json& x : parse_list(w, key, v, allowed, [&](const Json& x) {
         if (!x.is_string() || std::find(names.begin(), names.end(), x.get<std::string>()) == names.end())
           w.bad(key, v, allowed);
         return x;
       })) {
    if (std::find(out.begin(), out.end(), x.get<std::string>()) == out.end()) out.push_back(x.get<std::string>());
  }
  return out;
}

int64_t parse_one_int(const Where& w, const std::string& key, const Json& v, int64_t min_value,
                      const std::string& allowed) {
  if (!is_int(v) || v.get<int64_t>() < min_value) w.bad(key, v, allowed);
  return v.get<int64_t>();
}

double parse_positive(const Where& w, const std::string& key, const Json& v) {
  if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 1e9) w.bad(key, v, "a number > 0");
  return v.get<double>();
}

int64_t parse_int_at_least(const Where& w, const std::string& key, const Json& v, int64_t lo, int64_t hi) {
  if (!is_int(v) || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    w.bad(key, v, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v.get<int64_t>();
}

Json json_of_flag_text(const std::string& text) {
  Json items = Json::array();
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string tok = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    Json item = tok;
    if (tok == "true" || tok == "false") {
      item = tok == "true";
    } else if (tok == "null" || tok == "none") {
      item = nullptr;
    } else if (!tok.empty()) {
      try {
        size_t used = 0;
        const long long n = std::stoll(tok, &used);
        if (used == tok.size()) item = static_cast<int64_t>(n);
      } catch (const std::exception&) {  // not an integer
      }
      if (item.is_string()) {  // a real number (softcap 2.5, a sink logit), else a name
        char* end = nullptr;
        const double x = std::strtod(tok.c_str(), &end);
        if (end == tok.c_str() + tok.size() && std::isfinite(x)) item = x;
      }
    }
    items.push_back(item);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return items.size() == 1 ? items[0] : items;
}

}  // namespace attnlab::schema
