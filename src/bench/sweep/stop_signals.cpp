#include "bench/sweep/stop_signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <iterator>

namespace attnlab::bench {

namespace {

// The handler removes the marker (unlink is async-signal-safe), then re-raises the signal with
// the action installed before.
constexpr int kStopSignals[] = {SIGINT, SIGTERM};
struct sigaction g_previous_action[std::size(kStopSignals)];
char g_running_marker[4096];
volatile std::sig_atomic_t g_marker_armed = 0;

void on_stop_signal(int sig) {
  if (g_marker_armed) ::unlink(g_running_marker);
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    if (kStopSignals[i] == sig) ::sigaction(sig, &g_previous_action[i], nullptr);
  }
  ::raise(sig);  // delivered when this handler returns, to the previous action
}

}  // namespace

StopSignals::StopSignals() {
  static_assert(std::size(kStopSignals) == sizeof installed_ / sizeof installed_[0]);
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    struct sigaction now {};
    now.sa_handler = on_stop_signal;
    sigemptyset(&now.sa_mask);
    installed_[i] = ::sigaction(kStopSignals[i], nullptr, &g_previous_action[i]) == 0 &&
                    g_previous_action[i].sa_handler != SIG_IGN && ::sigaction(kStopSignals[i], &now, nullptr) == 0;
  }
}

StopSignals::~StopSignals() {
  g_marker_armed = 0;
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    if (installed_[i]) ::sigaction(kStopSignals[i], &g_previous_action[i], nullptr);
  }
}

RunningPoint::RunningPoint(const std::string& dir, const PointRecord& base) : dir_(dir), id_(base.id) {
  mark_attempt(dir, base);
  const std::string path = attempt_path(dir, id_);
  if (path.size() < sizeof g_running_marker) {
    std::memcpy(g_running_marker, path.c_str(), path.size() + 1);
    g_marker_armed = 1;
  }
}

void RunningPoint::finish() {
  g_marker_armed = 0;
  clear_attempt(dir_, id_);
  finished_ = true;
}

RunningPoint::~RunningPoint() {
  g_marker_armed = 0;
  if (!finished_) ::unlink(attempt_path(dir_, id_).c_str());
}

}  // namespace attnlab::bench
