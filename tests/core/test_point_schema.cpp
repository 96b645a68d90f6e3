// The point schema (src/schema/point_schema.hpp): the ids of every committed run come out of it
// unchanged, every field reaches the id or is derived, results.csv's header and rows come
// from the same cells, and a point survives experiment -> id -> point JSON -> CSV -> report.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/sweep/bench_point.hpp"
#include "bench/sweep/experiment.hpp"
#include "bench/results/files.hpp"
#include "schema/point_schema.hpp"
#include "bench/results/results.hpp"
#include "test_util.hpp"

namespace attnlab::bench {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kSource = ATTNLAB_SOURCE_DIR;

std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const auto header = test::split_csv(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    const auto cells = test::split_csv(line);
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

int64_t int_of(const std::map<std::string, std::string>& row, const std::string& key, int64_t fallback) {
  const auto it = row.find(key);
  return it == row.end() || it->second.empty() ? fallback : std::stoll(it->second);
}

// Every dense row of every committed results.csv: the schema gives the id it was written with
// (with the target in it where the experiment named targets), so resumes and compare.py keep
// matching old folders.
TEST(PointSchema, IdsOfCommittedRunsAreUnchanged) {
  int checked = 0, folders = 0;
  for (const auto& entry : fs::directory_iterator(kSource + "/results")) {
    const std::string csv = entry.path().string() + "/results.csv";
    if (!fs::exists(csv)) continue;
    ++folders;
    for (const auto& row : read_csv(csv)) {
      if (!row.count("pattern") || !row.at("pattern").empty()) continue;     // sparse: not rebuilt from columns
      if (row.count("score_mod") && !row.at("score_mod").empty()) continue;  // nor are the score terms' values
      Problem p;
      p.batch = int_of(row, "batch", 1);
      p.q_heads = int_of(row, "q_heads", 1);
      p.kv_heads = int_of(row, "kv_heads", 1);
      p.q_len = int_of(row, "q_len", 1);
      p.kv_len = int_of(row, "kv_len", 1);
      p.head_dim = int_of(row, "head_dim", 1);
      p.head_dim_v = int_of(row, "head_dim_v", p.head_dim);
      p.causal = static_cast<CausalAlign>(int_of(row, "causal", 0));
      p.window_left = int_of(row, "window_left", -1);
      p.window_right = int_of(row, "window_right", -1);
      p.layout = row.count("layout") && row.at("layout") == "bshd" ? Layout::BSHD : Layout::BHSD;
      if (row.count("dtype") && !row.at("dtype").empty()) p.dtype = parse_dtype(row.at("dtype"));
      if (row.count("kv_lens") && !row.at("kv_lens").empty()) {  // "1024.2048..." (a mixed-length batch)
        std::stringstream lens(row.at("kv_lens"));
        for (std::string len; std::getline(lens, len, '.');) p.kv_lens.push_back(std::stoll(len));
      }
      int unused = 0;  // the setting and sweep axes (kv_dtype, pass, ...) from their columns, where a folder has them
      for (const Axis& a : axes()) {
        if ((a.kind == AxisKind::Setting || a.kind == AxisKind::Sweep) && row.count(a.key) && !row.at(a.key).empty())
          set_axis(a, Where{csv}, json_of_flag_text(row.at(a.key)), p, unused);
      }
      const int threads = static_cast<int>(int_of(row, "threads", 1));
      const std::string model = row.count("model") ? row.at("model") : "";
      const std::string& kernel = row.at("kernel");
      const std::string plain = point_id(PointView{kernel, p, threads, {}, model});
      const std::string named = point_id(PointView{kernel, p, threads, row.at("isa"), model});
      EXPECT_TRUE(row.at("id") == plain || row.at("id") == named)
          << csv << ": id " << row.at("id") << ", the schema gives " << plain << " or " << named;
      ++checked;
    }
  }
  EXPECT_GE(folders, 20);
  EXPECT_GE(checked, 800) << "the committed runs hold more dense rows than this";
}

// The throwaway-axis check in small: every field in the id changes it away from its default,
// every field is a results.csv column written from the same cells as the header.
TEST(PointSchema, EveryFieldReachesTheIdOrIsDerivedAndIsAColumn) {
  Problem base = test::shape(1, 8, 8, 64, 64, 64);
  const std::string base_id = point_id(PointView{"flash", base, 2, {}, {}});
  EXPECT_EQ(base_id, "flash-b1-hq8-hkv8-sq64-sk64-d64-none-t2");
  EXPECT_EQ(point_name(PointView{"flash", base, 2, {}, {}}),
            "attn/flash/b:1/hq:8/hkv:8/sq:64/sk:64/d:64/mask:none/t:2");
  struct Variant {
    const char* field;
    Problem p;
    int threads;
    std::string isa, model;
  };
  auto with = [&](auto change) {
    Problem p = base;
    change(p);
    return p;
  };
  const std::vector<Variant> variants = {
      {"batch", with([](Problem& p) { p.batch = 2; }), 2, "", ""},
      {"q_heads", with([](Problem& p) { p.q_heads = 16; }), 2, "", ""},
      {"kv_heads", with([](Problem& p) { p.kv_heads = 2; }), 2, "", ""},
      {"q_len", with([](Problem& p) { p.q_len = 1; }), 2, "", ""},
      {"kv_len", with([](Problem& p) { p.kv_len = 128; }), 2, "", ""},
      {"head_dim", with([](Problem& p) { p.head_dim = 128; }), 2, "", ""},
      {"head_dim_v", with([](Problem& p) { p.head_dim_v = 32; }), 2, "", ""},
      {"mask", with([](Problem& p) { p.causal = CausalAlign::TopLeft; }), 2, "", ""},
      {"layout", with([](Problem& p) { p.layout = Layout::BSHD; }), 2, "", ""},
      {"dtype", with([](Problem& p) { p.dtype = DType::F16; }), 2, "", ""},
      {"kv_dtype", with([](Problem& p) { p.kv_dtype = KvDType::Q8_0; }), 2, "", ""},
      {"kv_block", with([](Problem& p) { p.kv_block = 64; }), 2, "", ""},
      {"kv_lens", with([](Problem& p) { p.kv_lens = {64}; }), 2, "", ""},
      {"kv_shared", with([](Problem& p) { p.kv_shared = true; }), 2, "", ""},
      {"pass", with([](Problem& p) { p.pass = Pass::Backward; }), 2, "", ""},
      {"score_mod", with([](Problem& p) { p.softcap = 30.f; }), 2, "", ""},
      {"topk_tokens", with([](Problem& p) { p.topk_tokens = 64; }), 2, "", ""},
      {"topk_sinks", with([](Problem& p) { p.topk_tokens = 64, p.topk_sinks = 4; }), 2, "", ""},
      {"topk_recent", with([](Problem& p) { p.topk_tokens = 64, p.topk_recent = 16; }), 2, "", ""},
      {"threads", base, 1, "", ""},
      {"isa", base, 2, "avx2", ""},
      {"model", base, 2, "", "llama-3-8b"},
  };
  std::set<std::string> ids = {base_id}, in_id;
  for (const Variant& v : variants) {
    const PointView view{"flash", v.p, v.threads, v.isa, v.model};
    const std::string id = point_id(view);
    EXPECT_TRUE(ids.insert(id).second) << v.field << ": " << id << " is not a new id";
    in_id.insert(v.field);
    const std::string name = point_name(view);
    EXPECT_NE(name, point_name(PointView{"flash", base, 2, {}, {}})) << v.field;
  }
  for (const PointField& f : point_fields()) {
    // A field outside the id must be derived from those in it (its value follows the mask or
    // the group), or two points of one id could differ in it.
    if (f.id_rank == 0) {
      EXPECT_TRUE(std::set<std::string>({"gqa_group", "causal", "window_left", "window_right", "pattern", "density"})
                      .count(f.name))
          << f.name << " is neither in the id nor a derived field";
    } else {
      EXPECT_TRUE(in_id.count(f.name)) << f.name << " is in the id but no variant above changes it";
    }
  }
  // results.csv: the header is the row's names; each schema field appears once, with its value.
  PointRecord r;
  r.kernel = "flash";
  r.problem = variants[6].p;  // head_dim_v 32
  r.threads = 2;
  r.model = "m";
  const auto row = tidy_row("exp", r);
  const auto cols = tidy_columns();
  ASSERT_EQ(row.size(), cols.size());
  std::map<std::string, std::string> cells;
  for (size_t i = 0; i < row.size(); ++i) {
    EXPECT_EQ(cols[i], row[i].name);
    EXPECT_TRUE(cells.emplace(row[i].name, row[i].text).second) << "column " << row[i].name << " twice";
  }
  const PointView view{r.kernel, r.problem, r.threads, {}, r.model};
  for (const PointField& f : point_fields()) {
    ASSERT_TRUE(cells.count(f.name)) << f.name;
    EXPECT_EQ(cells[f.name], f.value(view)) << f.name;
  }
  EXPECT_EQ(cells["head_dim_v"], "32");
  EXPECT_EQ(cells["model"], "m");
  // schema.json names every column field and the id's segments in order.
  const Json schema = schema_json();
  std::set<std::string> named;
  for (const Json& f : schema["fields"]) named.insert(f["name"].get<std::string>());
  for (const PointField& f : point_fields()) EXPECT_TRUE(named.count(f.name)) << f.name;
  EXPECT_TRUE(named.count("model"));
  ASSERT_GE(schema["id"].size(), 13u);
  EXPECT_EQ(schema["id"][0]["key"], "b");
  EXPECT_EQ(schema["id"].back()["key"], "model");
}

// experiment -> expand (ids) -> point JSON -> results.csv + schema.json -> report.py's loader:
// every field of every point arrives with the value it was given, typed as the schema says.
TEST(PointSchema, PointsSurviveExperimentToReport) {
  const std::string text = R"({"description": "schema round trip", "implementations": ["naive"],
      "grids": [{"q_len": 16, "q_heads": 4, "kv_heads": 2, "head_dim": 24, "threads": 1},
                {"q_len": 1, "kv_len": 40, "q_heads": 4, "kv_heads": 1, "head_dim": 32, "head_dim_v": 16,
                 "causal": "top_left", "window": [5, 0], "layout": "bshd", "dtype": "bf16", "threads": 2,
                 "model": "tiny"}]})";
  const Experiment e = parse_experiment_text(text, "roundtrip", {"naive"});
  const auto points = expand(e, 2);
  ASSERT_EQ(points.size(), 2u);
  std::vector<PointRecord> records;
  for (const GridPoint& g : points) {
    PointRecord r;
    r.id = g.id();
    r.kernel = g.kernel;
    r.model = g.model;
    r.problem = g.problem;
    r.threads = g.threads;
    r.status = PointStatus::Ok;
    r.times = {0.001, 0.002, 0.003};
    records.push_back(PointRecord::from_json(r.to_json()));  // what a point file gives back
    EXPECT_EQ(records.back().id, r.id);
  }
  const std::string dir = ::testing::TempDir() + "/attn_schema_roundtrip";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/results.csv") << tidy_csv("roundtrip", records);
  Json schema = schema_json();
  schema["columns"] = tidy_columns();
  std::ofstream(dir + "/schema.json") << schema.dump(1);
  // The expected typed value of every schema field, per point, as report.py must read it.
  Json expected = Json::array();
  for (const PointRecord& r : records) {
    const PointView view{r.kernel, r.problem, r.threads, {}, r.model};
    Json one = {{"id", r.id}, {"model", r.model}};
    for (const PointField& f : point_fields()) {
      const std::string v = f.value(view);
      if (std::string(f.type) == "int")
        one[f.name] = std::stoll(v);
      else if (std::string(f.type) == "real")
        one[f.name] = std::stod(v);
      else
        one[f.name] = v;
    }
    expected.push_back(one);
  }
  std::ofstream(dir + "/expected.json") << expected.dump();
  const std::string py = dir + "/check.py";
  std::ofstream(py)
      << "import json, sys\nsys.path.insert(0, '" << kSource << "/scripts')\n"
      << "import report\n"
      << "rows, *_ = report.load_results('" << dir << "')\n"
      << "want = json.load(open('" << dir << "/expected.json'))\n"
      << "bad = [(w['id'], k, r.get(k), v) for w, r in zip(want, rows) for k, v in w.items()\n"
      << "       if (abs(r.get(k) - v) > 1e-6 * abs(v) if isinstance(v, float) else r.get(k) != v)]\n"
      << "shape = [f['name'] for f in json.load(open('" << dir << "/schema.json'))['fields'] if f['shape']]\n"
      << "if report.DIMS != shape or list(report.SHAPE_KEYS) != shape: bad.append(('DIMS', report.DIMS))\n"
      << "print(bad); sys.exit(1 if bad or len(rows) != len(want) else 0)\n";
  if (std::system("/usr/bin/python3 -c 'import matplotlib, numpy' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with matplotlib and numpy (scripts/setup.sh)";
  }
  const int rc = std::system(("/usr/bin/python3 '" + py + "' > '" + dir + "/out.txt' 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << read_text_file(dir + "/out.txt");
  const PointRecord& labelled = records[0].model.empty() ? records[1] : records[0];
  EXPECT_NE(labelled.id.find("-d32v16-causal_tl_window_5_0-bshd-bf16-t2-tiny"), std::string::npos) << labelled.id;
}

// The input table reaches every interface: each axis is an experiment key (its default value
// parses and expands), a flag of every command its kind belongs to, and (a setting) a Python
// keyword (tests/python: test_every_setting_axis_is_a_keyword).
TEST(PointSchema, EveryAxisIsAKeyAFlagAndAKeyword) {
  const auto help = [](const std::string& command) {
    const std::string cmd = test::attnlab_exe() + " " + command + " --help 2>&1";
    std::string out;
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
    pclose(pipe);
    return out;
  };
  const std::map<std::string, std::string> helps = {{"run", help("run")},
                                                    {"verify", help("verify")},
                                                    {"sweep", help("sweep")},
                                                    {"generate", help("generate")},
                                                    {"cuda", help("cuda")}};
  const std::map<AxisKind, std::vector<std::string>> commands = {
      {AxisKind::Size, {"verify", "cuda"}},
      {AxisKind::Mask, {"run", "verify", "cuda"}},
      {AxisKind::Setting, {"run", "verify", "sweep", "generate", "cuda"}}};
  for (const Axis& a : axes()) {
    Json doc = {{"description", "d"}, {"implementations", {"naive"}}, {"q_len", 8}};
    doc[a.key] = a.fallback ? Json::parse(a.fallback) : Json(8);
    if (a.alternative) doc.erase(a.alternative);
    if (std::string_view(a.key) == "d_model") doc[a.key] = 64;  // a multiple of q_heads' default 8
    if (std::string_view(a.key) == "gqa_groups") doc[a.key] = 2;
    const Experiment e = parse_experiment(doc, "t.json", registry_kernel_names());
    EXPECT_EQ(expand(e, 1).size(), 1u) << a.key;
    ASSERT_NE(e.grids[0].values(a.key), nullptr) << a.key;
    const auto it = commands.find(a.kind);
    if (it == commands.end()) continue;
    for (const std::string& command : it->second) {
      EXPECT_NE(helps.at(command).find(flag_of(a.key)), std::string::npos)
          << "attnlab " << command << " has no " << flag_of(a.key);
    }
  }
  // The sizes generate takes, and none that it does not (its lengths are the prompt's).
  EXPECT_NE(helps.at("generate").find("--kv-heads"), std::string::npos);
  EXPECT_EQ(helps.at("generate").find("--q-len"), std::string::npos);
}

// The point file's problem is the axes table: every recorded axis under its key, read back
// through the same parsers to the same problem (pattern terms and a mask file included); the
// files written before (window_left/window_right, globals, causal 0/1/2, bigbird [0, 0, 0])
// still read.
TEST(PointSchema, ProblemFileIsTheAxesTable) {
  const std::string dir = (fs::temp_directory_path() / ("attn_problem_file_" + std::to_string(getpid()))).string();
  fs::create_directories(dir);
  const std::string mask = dir + "/m.npy";
  {  // a (40, 100) uint8 mask, one pair hidden
    std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (40, 100), }";
    while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    std::string bytes(40 * 100, '\x01');
    bytes[7] = 0;
    std::ofstream f(mask, std::ios::binary);
    f << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(dict.size()) << '\x00' << dict << bytes;
  }
  Problem p;
  p.batch = 2, p.q_heads = 4, p.kv_heads = 2, p.q_len = 40, p.kv_len = 100, p.head_dim = 64, p.head_dim_v = 32;
  p.causal = CausalAlign::TopLeft, p.window_left = 30, p.window_right = 2, p.sinks = 3, p.globals = {0, 50};
  p.dilation = 2, p.bigbird = BigBird{16, 1, 9}, p.kv_lens = {100, 60}, p.kv_dtype = KvDType::Q8_0;
  p.softcap = 2.5f, p.alibi = {0.5f, 0.25f, 0.125f, 1.f}, p.sink_logits = {0.f, 1.5f, -2.f, 3.f};
  int threads = 1;
  set_axis(*find_axis("mask_file"), Where{"t"}, Json(mask), p, threads);
  p.validate();
  const Json j = problem_to_json(p);
  for (const Axis& a : axes()) {  // every recorded axis (documents need q_len = kv_len: off here, absent)
    EXPECT_EQ(j.contains(a.key), a.read != nullptr && std::string_view(a.key) != "doc_lens")
        << a.key << ": " << j.dump();
  }
  const Problem back = problem_from_json(j);
  EXPECT_EQ(problem_to_json(back), j);
  EXPECT_EQ(back.describe(), p.describe());
  EXPECT_EQ(mask_name(back), mask_name(p));
  EXPECT_EQ(back.visible_pairs(), p.visible_pairs());
  // Off is the key's absence (its fallback), never a null that a reader has to know.
  EXPECT_EQ(problem_to_json(Problem{}).dump().find("null"), std::string::npos);

  const Problem old = problem_from_json(Json::parse(R"({"batch": 1, "bigbird": [0, 0, 0], "causal": 2,
      "dilation": 1, "doc_lens": [], "dtype": "f32", "globals": [5], "head_dim": 64, "head_dim_v": 64, "kv_heads": 2,
      "kv_len": 100, "kv_lens": [], "layout": "bhsd", "q_heads": 4, "q_len": 50, "sinks": 0, "window_left": 8,
      "window_right": -1})"));
  EXPECT_EQ(old.causal, CausalAlign::TopLeft);
  EXPECT_EQ(old.window_left, 8);
  EXPECT_EQ(old.window_right, -1);
  EXPECT_EQ(old.globals, std::vector<int64_t>{5});
  EXPECT_FALSE(old.bigbird.on());
  EXPECT_EQ(old.head_dim_v, 0);
  try {
    problem_from_json(Json::parse(R"({"batch": 1, "q_heads": 4})"));
    ADD_FAILURE() << "a point file without q_len read";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("point file: missing key 'q_len'"), std::string::npos) << e.what();
  }
  // A grid takes one mask file: two would share a point id (one would vanish as a duplicate).
  try {
    parse_experiment(Json::parse(R"({"description": "d", "implementations": ["naive"], "q_len": 40, "kv_len": 100,
        "mask_file": [")" + mask +
                                 R"(", "b.npy"]})"),
                     "t.json", registry_kernel_names());
    ADD_FAILURE() << "two mask files in one grid parsed";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("one file per grid"), std::string::npos) << e.what();
  }
  const Experiment both = parse_experiment(Json::parse(R"({"description": "d", "implementations": ["naive"],
      "q_len": 40, "kv_len": 100, "mask_file": [null, ")" +
                                                       mask + R"("]})"),
                                           "t.json", registry_kernel_names());
  EXPECT_EQ(expand(both, 1).size(), 2u);  // dense and the file's pattern
  fs::remove_all(dir);
}

// The odometer turns every axis: a grid's point count is the product of its values' counts,
// whatever order the axes come in, and each point carries one combination.
TEST(PointSchema, ExpandIsTheProductOfTheAxes) {
  const Json doc = Json::parse(R"({"description": "d", "implementations": ["naive"], "batch": [1, 2],
      "q_heads": [4, 8], "gqa_groups": [1, 4], "q_len": [8, 16], "kv_len": [8, "q_len", 32], "d_model": [64, 128],
      "head_dim_v": [0, 24], "causal": [false, "top_left"], "window": [null, [3, 0]], "layout": ["bhsd", "bshd"],
      "dtype": ["f32", "f16"], "threads": [1, 2]})");
  const Experiment e = parse_experiment(doc, "t.json", registry_kernel_names());
  const auto points = expand(e, 2);
  // kv_len 8 or "q_len" coincide at q_len 8: 2 * 2 * 2 * (2 * 3 - 1) * 2 * 2 * 2 * 2 * 2 * 2 * 2.
  EXPECT_EQ(points.size(), 2u * 2 * 2 * 5 * 2 * 2 * 2 * 2 * 2 * 2 * 2);
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> heads_dims;
  for (const GridPoint& g : points) {
    const Problem& p = g.problem;
    heads_dims.insert({p.q_heads, p.kv_heads, p.head_dim, p.dim_v()});
    EXPECT_TRUE(p.q_heads * p.head_dim == 64 || p.q_heads * p.head_dim == 128) << g.id();
  }
  // q_heads x gqa_groups x d_model x head_dim_v, each derived from the ones before it.
  EXPECT_EQ(heads_dims.size(), 16u);
  EXPECT_TRUE(heads_dims.count({8, 2, 16, 24})) << "q_heads 8, 4 groups, d_model 128, d_v 24";
  EXPECT_TRUE(heads_dims.count({4, 4, 16, 16})) << "q_heads 4, 1 group, d_model 64, d_v = head_dim";
}

}  // namespace
}  // namespace attnlab::bench

namespace attnlab::bench {
namespace {

// The roofline (results.hpp: roofline) on two points computed by hand: a decode step that memory
// bounds, and a prefill that an int8 unit's peak bounds; a point without a measured peak has none.
TEST(Roofline, HandComputedPoints) {
  PointRecord decode;
  decode.problem = test::shape(1, 32, 8, 1, 32768, 128);
  // bytes: Q 32 x 128 x 4 = 16384, O 16384, K and V 8 heads x 32768 keys x (512 + 512) = 268435456,
  // LSE 32 x 4 = 128: 268468352; FLOPs 2 x (128 + 128) x (32 x 32768 pairs) = 536870912.
  ASSERT_DOUBLE_EQ(decode.problem.bytes_moved(), 268468352.0);
  ASSERT_DOUBLE_EQ(decode.problem.flops(), 536870912.0);
  decode.read_probe = {38e9, 45e9, 40e9};  // the probe beside the point: its median, 40 GB/s
  decode.peak_read_bytes = 50e9;           // (the run's peak: not what a probed point is held to)
  decode.peak_flops = decode.unit_peak = 233e9;
  decode.status = PointStatus::Ok;
  decode.times = {8e-3};
  const Roofline m = roofline(decode);
  EXPECT_DOUBLE_EQ(m.seconds, 268468352.0 / 40e9);  // 6.71 ms, over the 2.30 ms its FLOPs need
  EXPECT_STREQ(m.bound, "memory");

  PointRecord prefill;
  prefill.problem = test::shape(1, 8, 8, 4096, 4096, 128);
  // FLOPs 2 x 256 x (8 x 4096 x 4096) = 68719476736; bytes Q, O 16777216 each, K and V 33554432,
  // LSE 131072: 67239936.
  ASSERT_DOUBLE_EQ(prefill.problem.flops(), 68719476736.0);
  ASSERT_DOUBLE_EQ(prefill.problem.bytes_moved(), 67239936.0);
  prefill.peak_read_bytes = 35e9;  // no probe: the run's read peak (1.92 ms)
  prefill.peak_flops = 233e9;
  prefill.unit_peak = 935e9;  // an int8-products kernel: vpdpbusd's peak
  prefill.status = PointStatus::Ok;
  prefill.times = {0.147};
  const Roofline c = roofline(prefill);
  EXPECT_DOUBLE_EQ(c.seconds, 68719476736.0 / 935e9);  // 73.5 ms
  EXPECT_STREQ(c.bound, "compute");

  // In results.csv: the time, the fraction of it the point reached, the bound.
  const auto cell = [](const PointRecord& r, const std::string& name) {
    for (const TidyCell& c : tidy_row("exp", r))
      if (c.name == name) return c.text;
    return std::string("(no column)");
  };
  EXPECT_NEAR(std::stod(cell(prefill, "roofline_fraction")), 68719476736.0 / 935e9 / 0.147, 1e-6);
  EXPECT_EQ(cell(prefill, "roofline_bound"), "compute");
  EXPECT_NEAR(std::stod(cell(decode, "roofline_fraction")), 268468352.0 / 40e9 / 8e-3, 1e-6);

  PointRecord unmeasured = prefill;
  unmeasured.unit_peak = 0;
  EXPECT_EQ(roofline(unmeasured).seconds, 0.0);
  EXPECT_EQ(cell(unmeasured, "roofline_fraction"), "");
  EXPECT_EQ(cell(unmeasured, "roofline_bound"), "");
}

}  // namespace
}  // namespace attnlab::bench
