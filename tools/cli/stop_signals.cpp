#include "tools/cli/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace stp::tools {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kCount = sizeof kSignals / sizeof kSignals[0];

// Everything the handler touches: a lock-free atomic and lines composed before any signal can
// come, so the handler calls only async-signal-safe functions (write, _exit).
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free);
char g_again[kCount][256];
std::size_t g_again_len[kCount];
struct sigaction g_previous[kCount];

int index_of(int signal) {
  for (int i = 0; i < kCount; ++i)
    if (kSignals[i] == signal) return i;
  return -1;
}

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  if (g_received.compare_exchange_strong(none, signal)) return;  // the first: recorded
  const int i = index_of(signal);
  if (i >= 0) {
    ssize_t ignored = ::write(STDERR_FILENO, g_again[i], g_again_len[i]);
    (void)ignored;
  }
  ::_exit(stop_status(signal));
}

}  // namespace

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a stop signal";
  }
}

StopSignals::StopSignals(const char* program) {
  g_received = 0;
  // On a terminal the progress line may be open: the message starts a line of its own.
  const char* newline = ::isatty(STDERR_FILENO) ? "\n" : "";
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < kCount; ++i) {
    const int n = std::snprintf(g_again[i], sizeof g_again[i],
                                "%s%s: %s again: exiting at once (status %d) without a checkpoint; the checkpoints "
                                "already written are intact\n",
                                newline, program, stop_signal_name(kSignals[i]), stop_status(kSignals[i]));
    g_again_len[i] = n < 0 ? 0 : std::min(static_cast<std::size_t>(n), sizeof g_again[i] - 1);
  }
  for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() const { return g_received.load(); }

}  // namespace stp::tools
