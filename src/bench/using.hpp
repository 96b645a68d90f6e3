// The harness builds on the point schema (src/schema: what a point is, the input grammar) and
// the machine's measured limits (src/peaks: peaks, medians), and speaks their words
// unqualified.
#pragma once

#include "peaks/peak.hpp"
#include "peaks/stats.hpp"
#include "schema/point_schema.hpp"

namespace attnlab::bench {
using namespace attnlab::schema;  // NOLINT(google-build-using-namespace)
using namespace attnlab::peaks;   // NOLINT(google-build-using-namespace)
}  // namespace attnlab::bench
