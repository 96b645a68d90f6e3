#include "bench/sweep/sweep_folder.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>
#include <ostream>
#include <tuple>

#include "attnlab/verify.hpp"
#include "bench/results/files.hpp"
#include "bench/results/machine.hpp"
#include "bench/results/results.hpp"
#include "bench/sweep/sweep.hpp"

namespace attnlab::bench {

using Json = nlohmann::json;

std::pair<int, int> parse_shard(const std::string& text) {
  const std::string allowed = "'i/n' with integers 0 <= i < n (e.g. 0/4 ... 3/4)";
  const auto slash = text.find('/');
  if (slash == std::string::npos) throw InvalidInput("shard: '" + text + "' is not allowed; allowed: " + allowed);
  try {
    size_t a = 0, b = 0;
    const int i = std::stoi(text.substr(0, slash), &a);
    const int n = std::stoi(text.substr(slash + 1), &b);
    if (a != slash || b != text.size() - slash - 1 || n < 1 || i < 0 || i >= n) throw std::invalid_argument(text);
    return {i, n};
  } catch (const std::exception&) {
    throw InvalidInput("shard: '" + text + "' is not allowed; allowed: " + allowed);
  }
}

namespace {
// The date and sequence number (1 without a suffix) of a default folder name
// "<YYYY-MM-DD>-<body>" or "<YYYY-MM-DD>-<body>-<N>"; nullopt for any other name.
std::optional<std::pair<std::string, long>> parse_folder_name(const std::string& name, const std::string& body) {
  if (name.size() < 11 + body.size() || name[10] != '-') return std::nullopt;
  for (int i = 0; i < 10; ++i) {
    const bool ok = (i == 4 || i == 7) ? name[i] == '-' : std::isdigit(static_cast<unsigned char>(name[i])) != 0;
    if (!ok) return std::nullopt;
  }
  const std::string date = name.substr(0, 10), rest = name.substr(11);
  if (rest == body) return std::make_pair(date, 1L);
  if (rest.size() <= body.size() + 1 || rest.compare(0, body.size(), body) != 0 || rest[body.size()] != '-') {
    return std::nullopt;
  }
  const std::string n = rest.substr(body.size() + 1);
  if (n.size() > 9 || n[0] == '0' || !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::make_pair(date, std::stol(n));
}
}  // namespace

std::string choose_out_dir(const std::string& experiment, const SweepOptions& o) {
  if (!o.out_dir.empty()) return o.out_dir;
  namespace fs = std::filesystem;
  const std::string body =
      experiment +
      (o.shard_count > 1 ? "-shard" + std::to_string(o.shard_index) + "of" + std::to_string(o.shard_count) : "");
  if (o.resume) {
    // Newest by the creation time sweep.json records, then by name date and sequence
    // number (numerically: -10 is newer than -2); lexical order would put -10 first.
    using Key = std::tuple<int64_t, std::string, long>;
    std::optional<std::pair<Key, std::string>> newest;
    std::error_code ec;
    if (fs::is_directory(o.results_root, ec)) {
      for (const auto& d : fs::directory_iterator(o.results_root, ec)) {
        const auto parsed = parse_folder_name(d.path().filename().string(), body);
        const std::string path = d.path().string();
        if (!parsed || !d.is_directory() || !file_exists(path + "/sweep.json")) continue;
        try {
          const SweepPlan plan = SweepPlan::from_json(Json::parse(read_text_file(path + "/sweep.json")));
          // "quick-2" could be experiment quick's second folder or experiment quick-2's.
          if (plan.experiment != experiment || plan.shard_index != o.shard_index || plan.shard_count != o.shard_count) {
            continue;
          }
          const Key key{plan.created_unix_ns, parsed->first, parsed->second};
          if (!newest || newest->first < key) newest = {key, path};
        } catch (const std::exception&) {
          continue;  // not a readable sweep folder: not a candidate
        }
      }
    }
    if (newest) return newest->second;
  }
  const std::string base = o.results_root + "/" + today() + "-" + body;
  std::string dir = base;
  for (int n = 2; std::filesystem::exists(dir); ++n) dir = base + "-" + std::to_string(n);
  return dir;
}

Json check_same_build(const std::string& dir, const Json& old_machine, bool force, std::ostream& log) {
  const Json now = describe_machine();
  auto field = [](const Json& m, const char* what) -> std::string {
    if (std::string(what) == "git commit") return m.value("git", Json::object()).value("commit", "unknown");
    if (std::string(what) == "default isa") {
      // Points without an "isa" key in the experiment ran the default target (--isa, ATTN_ISA).
      const Json isa = m.value("isa", Json::object());
      return isa.value("default", isa.value("simd_arch", std::string("unknown")));
    }
    return m.value(what, std::string("unknown"));
  };
  std::string diffs;
  for (const char* what : {"git commit", "build_type", "flags", "default isa"}) {
    const std::string was = field(old_machine, what), is = field(now, what);
    if (was != is) diffs += std::string(diffs.empty() ? "" : "; ") + what + " '" + was + "' there, '" + is + "' here";
  }
  if (old_machine.value("git", Json::object()).value("dirty", false) || now["git"].value("dirty", false)) {
    log << "note: " << dir << " or this build has uncommitted changes; the commit alone cannot tell whether "
        << "the code is the same\n";
  }
  if (diffs.empty()) return Json();
  if (!force) {
    throw InvalidInput("resume: " + dir + " was measured by another build (" + diffs +
                       "); its points and new ones would mix two builds. allowed: the same build, --force to "
                       "resume anyway (recorded in machine.json as forced_resumes), or a new --out folder");
  }
  log << "note: --force: resuming " << dir << " measured by another build (" << diffs << ")\n";
  return {{"date", now_iso8601()},
          {"differences", diffs},
          {"git", now["git"]},
          {"build_type", now["build_type"]},
          {"flags", now["flags"]}};
}

}  // namespace attnlab::bench
