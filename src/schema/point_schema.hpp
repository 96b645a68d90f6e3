// The point schema: what a measured point is, field by field, described once. A field's row
// says its results.csv column (and schema.json name), its type, whether it is part of the
// point's shape (reports group and hold fixed on shape fields), its segment in the point id
// and in the Google Benchmark name (left out at its default, so the ids of points from before
// an axis existed stay as they were and old folders still resume), and its Google Benchmark
// counter. Point ids and names, the counters, the point columns of results.csv, the sweep's
// one-line description and each results folder's schema.json (which scripts/report.py and
// scripts/compare.py read) all come from this table.
//
// The input side is the second table, axes(): what an experiment key, a grid entry, a CLI
// flag and a Python keyword may set, parsed and applied the same way everywhere.
//
// Adding an axis (a sparse pattern term is one): its field in Problem, then one row in each
// table of point_schema.cpp (the column it is measured as, the key that sets it and reads it
// back); the kernels that use it are the rest (docs/architecture.md). Experiment files,
// expand(), the CLI flags, the Python keywords, the point file's problem, point ids, counters,
// results.csv and reports follow from the rows.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/problem.hpp"
#include "schema/values.hpp"

namespace attnlab::schema {

// A point as the schema sees it: the problem and the grid's extras.
struct PointView {
  std::string_view kernel;
  const Problem& problem;
  int threads = 1;
  std::string_view isa;    // the target named by an experiment's "isa" key ("" = default)
  std::string_view model;  // the grid's "model" label ("" = none)
};

struct PointField {
  const char* name;      // results.csv column, schema.json name, counter name unless `counter` says
  const char* type;      // "int", "real" or "text"
  const char* describe;  // one line: what it is
  bool shape;            // part of the shape (a report's held-fixed set); false: derived or a label
  // The point id's segment: id_prefix + value, after the kernel, in id_rank order (0: not in
  // the id or name); name_prefix the same in the Google Benchmark name. `omitted` true: the
  // field is at the default that ids have always left out.
  int id_rank;
  const char* id_prefix;
  const char* name_prefix;
  bool (*omitted)(const PointView&);
  std::string (*value)(const PointView&);  // the column's text (and the segment's value)
  // A Google Benchmark counter (plots read counters, never names): its name, and its value;
  // nullptr: none.
  const char* counter;
  double (*counter_value)(const PointView&);
};

// The table, in results.csv column order.
const std::vector<PointField>& point_fields();

// "flash-b1-hq8-hkv8-sq4096-sk4096-d128-none-t2" (+ "-bshd", "-bf16", "-avx2", "-MODEL", ...).
std::string point_id(const PointView& v);
// "attn/flash/b:1/hq:8/hkv:8/sq:4096/sk:4096/d:128/mask:none/t:2" (+ "/isa:avx2", ...).
std::string point_name(const PointView& v);
// "flash[avx2] b1 h8/8 q4096 kv4096 d128 none t2": the sweep's progress line; `label` is the
// kernel as output names it (kernel_label).
std::string describe_point(const PointView& v, std::string_view label);

// What schema.json holds: {"schema": "attnlab-point-1", "fields": [{name, type, describe,
// shape, in_id}, ...]}.
nlohmann::json schema_json();

// An input axis: a key of experiment files (top level or a "grids" entry, a list of values
// making it an axis of the grid), a CLI flag (flag_of(key)), a Python keyword and a key of the
// point file's problem (problem_to_json).
enum class AxisKind {
  Size,     // a size: read off the arrays where there are arrays (run, the Python module)
  Setting,  // a setting every interface takes: CLI flag on run, verify, sweep; Python keyword
  Mask,     // the mask: causal, window, per-batch cache lengths and every sparse pattern term; the
            // CLI's mask flags (--causal, --window, --sinks, ...) and Python keywords
  Score,    // the score modifications (softcap, alibi, sink_logits: score_mod.hpp); CLI flags on run,
            // verify and sweep beside the mask's, Python keywords
  Run,      // how it runs (threads)
  Sweep,    // what a sweep's point computes (pass): experiment files and sweep's flag only (run and
            // verify say --backward; Python has attention_backward)
};
struct Axis {
  const char* key;
  AxisKind kind;
  const char* help;         // one line, for the CLI's --help and the docs
  const char* alternative;  // a key that replaces this one (gqa_groups for kv_heads); nullptr
  const char* fallback;     // JSON text of the value when absent (and its alternative too); nullptr: required
  // The values a key's JSON gives (each normalized: apply reads them), calling w.bad on bad ones.
  std::vector<Json> (*parse)(const Where& w, const std::string& key, const Json& v);
  // Sets one value into a point; earlier axes are set already (kv_heads reads q_heads).
  void (*apply)(const Where& w, const std::string& key, const Json& v, Problem& p, int& threads);
  // The value a problem holds, as parse reads it back (the point file's problem); nullptr: not
  // recorded (an alternative's value is its partner's; threads are the point's, not the problem's).
  Json (*read)(const Problem& p) = nullptr;
  // The CLI flag alone means this value (--causal: true; --causal=top_left names another); nullptr:
  // the flag takes a value.
  const char* bare = nullptr;
};

// "size", "setting", "mask", "score", "run", "sweep".
const char* to_string(AxisKind kind);

// The table, in the order values are applied.
const std::vector<Axis>& axes();
// nullptr when no axis has this key.
const Axis* find_axis(std::string_view key);
// Sets one axis of `p` from a JSON value holding one value (a CLI flag, a Python keyword);
// several values, or a bad one, are an error naming the key.
void set_axis(const Axis& a, const Where& w, const Json& value, Problem& p, int& threads);

// The point file's problem: every recorded axis (Axis::read) under its key, so the file reads
// back through the same parsers (problem_from_json), and a new axis is recorded by its row.
nlohmann::json problem_to_json(const Problem& p);
// Reads problem_to_json's object (and the older files' key names: window_left/window_right,
// globals, causal as 0/1/2); a missing required key or a bad value is InvalidInput naming it.
Problem problem_from_json(const nlohmann::json& j);

// "none", "causal", "causal_tl", "window_L_R", "causal_window_L_R" (L/R: -1 = unbounded),
// then the sparse pattern's name.
std::string mask_name(const Problem& p);
// Visible pairs over all (b, h, i, j) pairs.
double density(const Problem& p);

// A number as results.csv writes it: "%.6g", non-finite values as inf, -inf, nan (what Python's
// float() reads).
std::string csv_number(double v);

}  // namespace attnlab::schema
