// Stopping a sweep (Ctrl-C, a batch system's SIGTERM) is not the running point's fault: while
// StopSignals is alive, those signals remove the running point's attempt marker (RunningPoint)
// before the process ends as it would have, so a resume measures that point again. Only a
// process that dies otherwise (out-of-memory kill, SIGKILL, a crash) leaves the marker, and a
// resume records that point as failed instead of dying on it again.
#pragma once

#include <string>

#include "bench/results/results.hpp"

namespace attnlab::bench {

// Installs the handler for the sweep's loop (not over an ignored signal), restores after.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool installed_[2] = {};  // SIGINT, SIGTERM
};

// The attempt marker of the point being measured: written before it runs, removed by
// finish() once its point file is written, and also when an exception stops the sweep
// (an error, e.g. a full disk, is not a death: a resume measures the point again).
class RunningPoint {
 public:
  RunningPoint(const std::string& dir, const PointRecord& base);
  void finish();
  ~RunningPoint();
  RunningPoint(const RunningPoint&) = delete;
  RunningPoint& operator=(const RunningPoint&) = delete;

 private:
  std::string dir_, id_;
  bool finished_ = false;
};

}  // namespace attnlab::bench
