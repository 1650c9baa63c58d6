#include "chaos/process.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace idem::chaos {

int64_t NowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

namespace {

// The caller's environment without IDEM_* and TRAVEL_* (built before fork:
// nothing allocates in the child).
std::vector<std::string> CleanEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string v = *e;
    if (v.rfind("IDEM_", 0) == 0 || v.rfind("TRAVEL_", 0) == 0) continue;
    env.push_back(std::move(v));
  }
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& items) {
  std::vector<char*> out;
  out.reserve(items.size() + 1);
  for (auto& s : items) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

Child Child::Spawn(const std::vector<std::string>& argv, const std::string& out,
                   const std::string& err, bool append, const std::vector<std::string>& extra_env) {
  const int flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC);
  // Truncate here, not only in the child: a child killed before its open()
  // must not leave the previous child's output to be read as its own.
  if (!append) {
    for (const std::string* path : {&out, &err}) {
      int fd = open(path->c_str(), flags, 0644);
      if (fd >= 0) close(fd);
    }
  }
  std::vector<std::string> args = argv;
  std::vector<std::string> env = CleanEnvironment();
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> arg_ptrs = Pointers(args);
  std::vector<char*> env_ptrs = Pointers(env);
  Child c;
  c.started_ms_ = NowMs();
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), flags, 0644);
    int e = open(err.c_str(), flags, 0644);
    if (o >= 0) dup2(o, 1);
    if (e >= 0) dup2(e, 2);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    execve(arg_ptrs[0], arg_ptrs.data(), env_ptrs.data());
    const char* msg = "chaos: exec failed: ";
    (void)!write(2, msg, std::strlen(msg));
    (void)!write(2, arg_ptrs[0], std::strlen(arg_ptrs[0]));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  c.pid_ = pid;
  return c;
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) Kill();
}

Child::Child(Child&& other) noexcept { *this = std::move(other); }

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !reaped_) Kill();
    pid_ = other.pid_;
    started_ms_ = other.started_ms_;
    done_ = other.done_;
    reaped_ = other.reaped_;
    other.pid_ = -1;
    other.reaped_ = false;
  }
  return *this;
}

Exit Child::WaitFor(int64_t ms) {
  if (pid_ <= 0 || reaped_) return done_;
  const int64_t deadline = ms < 0 ? -1 : NowMs() + ms;
  int64_t sleep_us = 200;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      done_.running = false;
      done_.ms = NowMs() - started_ms_;
      if (WIFSIGNALED(status)) {
        done_.killed = true;
        done_.signal = WTERMSIG(status);
      } else {
        done_.code = WEXITSTATUS(status);
      }
      return done_;
    }
    if (r < 0) {  // not our child any more: treat as gone
      reaped_ = true;
      done_.code = 127;
      done_.ms = NowMs() - started_ms_;
      return done_;
    }
    int64_t now = NowMs();
    if (deadline >= 0 && now >= deadline) {
      Exit e;
      e.running = true;
      e.ms = now - started_ms_;
      return e;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    if (sleep_us < 2000) sleep_us *= 2;
  }
}

bool Child::Kill() {
  if (pid_ <= 0 || reaped_) return false;
  // Reaped already (it ended just now)? Then the kill did not hit it.
  Exit e = WaitFor(0);
  if (!e.running) return false;
  kill(pid_, SIGKILL);
  kill(pid_, SIGCONT);
  WaitFor(-1);
  return true;
}

void Child::Stop() {
  if (pid_ > 0 && !reaped_) kill(pid_, SIGSTOP);
}

void Child::Continue() {
  if (pid_ > 0 && !reaped_) kill(pid_, SIGCONT);
}

std::string ReadFileText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace idem::chaos
