// Polite stop requests to a long-running command (docs/design.md, Signals and exit statuses):
// SIGINT (Ctrl-C), SIGTERM (kill, timeout, docker stop, systemd, Kubernetes, Slurm) and SIGHUP (the
// terminal or ssh session went away).
//
// While a StopSignals object exists, the first of these signals only records its number
// (received()): the command looks at it where stopping is consistent (stp train: between steps),
// finishes what it must (a checkpoint) and returns stop_status(received()). A second one, of any of
// the three, means "now": its handler writes one line to stderr ("PROGRAM: SIGTERM again: exiting
// at once ...") and ends the process with 128 + its number (_exit: no destructors run and no
// buffered output is flushed). This is the one exit outside main(), and why every file stp calls
// complete is written under a temporary name and renamed into place (formats/checkpoint.h): a file
// cut short by it is never named as complete.
//
// Handlers are installed with SA_RESTART, so the system calls of the command's threads go on
// after the first signal. The destructor puts back the dispositions it found. One object at a time.
#pragma once

namespace stp::tools {

class StopSignals {
 public:
  // `program` (e.g. "stp train") starts the second signal's line; it must outlive the object.
  explicit StopSignals(const char* program);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal's number (SIGINT, SIGTERM or SIGHUP), 0 while none came.
  int received() const;
};

// The conventional exit status of a process stopped by `signal`: 128 + its number (130 SIGINT,
// 143 SIGTERM, 129 SIGHUP), what a shell reports for a process the signal killed.
constexpr int stop_status(int signal) { return 128 + signal; }

// "SIGINT", "SIGTERM", "SIGHUP"; "signal N" for any other number.
const char* stop_signal_name(int signal);

}  // namespace stp::tools
