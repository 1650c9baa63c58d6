#include "cli/driver_lock.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

namespace idem::cli {

DriverLock::~DriverLock() {
  if (fd_ >= 0) ::close(fd_);
}

DriverLock::Holder DriverLock::ReadHolder() const {
  Holder h;
  char buf[128] = {};
  ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return h;
  char* end = nullptr;
  long pid = std::strtol(buf, &end, 10);
  // A record left by a process that is gone says nothing about the holder.
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return h;
  h.pid = static_cast<pid_t>(pid);
  std::string rest(end);
  size_t b = rest.find_first_not_of(' ');
  size_t e = rest.find_first_of(" \n", b);
  if (b != std::string::npos) h.command = rest.substr(b, e == std::string::npos ? e : e - b);
  return h;
}

void DriverLock::WriteHolder(const std::string& command) const {
  std::string record = std::to_string(::getpid()) + " " + command + "\n";
  if (::ftruncate(fd_, 0) != 0) return;  // the record is advice only
  (void)!::pwrite(fd_, record.data(), record.size(), 0);
}

Status DriverLock::Acquire(const std::string& db, const std::string& command, int64_t wait_ms) {
  const std::string path = db + ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) return Status::Unavailable(path + ": cannot open the driver lock");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  bool told = false;
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      WriteHolder(command);
      return Status::Ok();
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      return Status::Unavailable(path + ": cannot take the lock");
    }
    holder_ = ReadHolder();
    if (holder_.LongRunning() || std::chrono::steady_clock::now() >= deadline) break;
    if (!told) {
      std::string who =
          holder_.pid > 0 ? " (pid " + std::to_string(holder_.pid) + ", `" + holder_.command + "`)"
                          : "";
      std::fprintf(stderr, "waiting: another process%s is driving sagas on %s (up to %lld s)\n",
                   who.c_str(), db.c_str(), static_cast<long long>(kOneShotWaitMs / 1000));
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string who;
  if (holder_.pid > 0) {
    who = " (pid " + std::to_string(holder_.pid) +
          (holder_.command.empty() ? "" : ", `" + holder_.command + "`") + ")";
  }
  return Status::Aborted("the journal " + db + " is being driven by another process" + who);
}

}  // namespace idem::cli
