#include "mcp/client_stdio.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace idem::mcp {
namespace {

constexpr size_t kMaxLineBytes = 16u << 20;

std::string Joined(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out;
}

std::string ExitText(int status) {
  if (WIFEXITED(status))
    return "the upstream exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "the upstream was killed by signal " + std::to_string(WTERMSIG(status));
  return "the upstream stopped";
}

class StdioTransport : public ClientTransport {
 public:
  explicit StdioTransport(std::vector<std::string> argv) : argv_(std::move(argv)) {}
  ~StdioTransport() override { Close(); }

  Status Start(TransportSinks sinks) override {
    if (argv_.empty() || argv_[0].empty()) {
      return Status::InvalidArgument("the upstream command is empty");
    }
    sinks_ = std::move(sinks);
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0)
      return Status::Unavailable(Describe() + ": pipe: " + std::strerror(errno));
    if (pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return Status::Unavailable(Describe() + ": pipe: " + std::strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (std::string& a : argv_) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
      ::close(in[1]);
      ::close(out[0]);
      return Status::Unavailable(Describe() + ": cannot start " + argv_[0] + ": " +
                                 std::strerror(rc));
    }
    pid_ = pid;
    stdin_fd_ = in[1];
    stdout_fd_ = out[0];
    reader_ = std::thread([this] { ReadLoop(); });
    return Status::Ok();
  }

  SendResult Send(const Message& message, int64_t timeout_ms) override {
    (void)timeout_ms;  // a pipe write blocks only while the child does not read
    SendResult r;
    const std::string line = Encode(message) + "\n";
    std::lock_guard<std::mutex> lock(write_mu_);
    if (stdin_fd_ < 0 || eof_.load()) {
      r.kind = SendResult::Kind::kNotSent;
      r.error = "the upstream process is gone";
      return r;
    }
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(stdin_fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        // Nothing written: the child cannot have read it. Part of it: it
        // cannot parse half a line either, but say unknown to be safe.
        r.kind = done == 0 ? SendResult::Kind::kNotSent : SendResult::Kind::kMaybeSent;
        r.error = std::string("writing to the upstream: ") + std::strerror(errno);
        return r;
      }
      done += static_cast<size_t>(n);
    }
    return r;
  }

  void Close() override {
    std::lock_guard<std::mutex> close_lock(close_mu_);
    if (closed_) return;
    closed_ = true;
    closing_.store(true);
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      if (stdin_fd_ >= 0) ::close(stdin_fd_);
      stdin_fd_ = -1;
    }
    if (pid_ > 0) {
      if (!WaitExit(2'000)) {
        ::kill(pid_, SIGTERM);
        if (!WaitExit(2'000)) {
          ::kill(pid_, SIGKILL);
          WaitExit(-1);
        }
      }
    }
    if (reader_.joinable()) reader_.join();
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    stdout_fd_ = -1;
  }

  std::string Describe() const override { return "stdio upstream `" + Joined(argv_) + "`"; }

 private:
  // Reaps the child within `ms` (-1: however long); true once reaped.
  bool WaitExit(int64_t ms) {
    std::lock_guard<std::mutex> lock(reap_mu_);
    if (reaped_) return true;
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(ms < 0 ? 0 : ms);
    for (;;) {
      int status = 0;
      const pid_t got = ::waitpid(pid_, &status, ms < 0 ? 0 : WNOHANG);
      if (got == pid_ || (got < 0 && errno != EINTR)) {
        reaped_ = true;
        exit_status_ = status;
        return true;
      }
      if (ms >= 0 && std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void ReadLoop() {
    std::string buf;
    char chunk[65536];
    std::string reason;
    for (;;) {
      const ssize_t n = ::read(stdout_fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        reason = n == 0 ? "EOF on its stdout"
                        : std::string("reading its stdout: ") + std::strerror(errno);
        break;
      }
      buf.append(chunk, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) {
        std::string line = buf.substr(start, nl - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        auto decoded = Decode(line);
        if (auto* m = std::get_if<Message>(&decoded)) sinks_.on_message(*m);
      }
      buf.erase(0, start);
      if (buf.size() > kMaxLineBytes) {
        reason = "a line longer than 16 MiB on its stdout";
        break;
      }
    }
    eof_.store(true);
    if (closing_.load()) return;
    // The child exits right after its stdout closes, as a rule: say how.
    if (WaitExit(200)) reason += "; " + ExitText(exit_status_);
    sinks_.on_closed(reason);
  }

  std::vector<std::string> argv_;
  TransportSinks sinks_;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::thread reader_;
  std::mutex write_mu_;
  std::mutex close_mu_;
  std::mutex reap_mu_;
  bool closed_ = false;
  bool reaped_ = false;
  int exit_status_ = 0;
  std::atomic<bool> closing_{false};
  std::atomic<bool> eof_{false};
};

}  // namespace

std::unique_ptr<ClientTransport> NewStdioTransport(std::vector<std::string> argv) {
  return std::make_unique<StdioTransport>(std::move(argv));
}

Result<std::vector<std::string>> SplitCommandLine(const std::string& line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const size_t end = line.find('\'', i + 1);
      if (end == std::string::npos) {
        return Status::InvalidArgument("unterminated ' at character " + std::to_string(i + 1));
      }
      cur += line.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size() && (line[j + 1] == '"' || line[j + 1] == '\\'))
          ++j;
        cur += line[j];
      }
      if (j >= line.size()) {
        return Status::InvalidArgument("unterminated \" at character " + std::to_string(i + 1));
      }
      i = j;
    } else if (c == '\\') {
      if (i + 1 >= line.size()) return Status::InvalidArgument("a trailing \\");
      cur += line[++i];
    } else {
      cur += c;
    }
  }
  if (in_word) words.push_back(cur);
  if (words.empty()) return Status::InvalidArgument("no command");
  return words;
}

}  // namespace idem::mcp
