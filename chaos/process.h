#pragma once
// The sweep's child processes: spawn one with its output in files, wait for
// it with a deadline, kill, stop and continue it.
//
//   chaos::Child c = chaos::Child::Spawn(argv, dir + "/out", dir + "/err");
//   chaos::Exit e = c.WaitFor(250);      // 250 ms at most
//   if (e.running) c.Kill();             // SIGKILL, then reaped
//
// A child runs with this process's environment minus its IDEM_* and
// TRAVEL_* variables, so no setting of the caller leaks into it. A Child
// owns its process: the destructor kills (SIGCONT, then SIGKILL) and reaps
// one still running, so nothing outlives the sweep.
//
// Thread safety: a Child is used from one thread.

#include <cstdint>
#include <string>
#include <vector>

#include <sys/types.h>

namespace idem::chaos {

/// How a child ended, or that it still runs.
struct Exit {
  bool running = false;  ///< still running at the deadline
  bool killed = false;   ///< ended by a signal (SIGKILL from the sweep, or a crash)
  int signal = 0;        ///< the signal when killed
  int code = 0;          ///< the exit code otherwise
  int64_t ms = 0;        ///< from spawn to the end (or to the deadline)
};

/// Milliseconds of a monotonic clock.
int64_t NowMs();

class Child {
 public:
  Child() = default;
  /// Starts argv[0] (a path) with the arguments; stdout and stderr go to
  /// the files (truncated, or with `append` appended to), `extra_env`
  /// ("NAME=VALUE") added to its environment. A child that cannot start
  /// exits 127 at once (its stderr says why).
  static Child Spawn(const std::vector<std::string>& argv, const std::string& out,
                     const std::string& err, bool append = false,
                     const std::vector<std::string>& extra_env = {});
  ~Child();
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int64_t started_ms() const { return started_ms_; }

  /// Waits until the child ends or `ms` pass (ms < 0: no deadline).
  Exit WaitFor(int64_t ms);
  /// Whether it ended (reaped), without waiting.
  Exit Poll() { return WaitFor(0); }
  /// SIGKILL (a stopped child is continued first so it dies), then reaps.
  /// True when the signal hit a live process.
  bool Kill();
  /// SIGSTOP / SIGCONT.
  void Stop();
  void Continue();

 private:
  pid_t pid_ = -1;
  int64_t started_ms_ = 0;
  Exit done_;
  bool reaped_ = false;
};

/// The whole text of a file ("" if it cannot be read).
std::string ReadFileText(const std::string& path);

}  // namespace idem::chaos
