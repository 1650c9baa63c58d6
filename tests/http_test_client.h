#pragma once
// Raw loopback HTTP clients for the http/ tests and the http_attack program:
// blocking POSIX sockets with explicit deadlines, so a test can be as rude
// as an attacker (half a header, a byte every few seconds, a body that
// never ends, a response never read).
//
// Thread safety: one RawClient per thread; the free functions are safe from
// any thread.

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#include "http/server.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace idem::http::testing {

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// The process's resident set size in KiB (VmRSS of /proc/self/status).
inline int64_t RssKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

/// One TCP connection to 127.0.0.1:port.
class RawClient {
 public:
  explicit RawClient(int port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    if (fd_ >= 0) {
      int one = 1;
      ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
  }
  ~RawClient() { Close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  /// Sends all of `data` unless the peer closes or `timeout_ms` passes.
  bool Send(const std::string& data, int timeout_ms = 2000) {
    size_t sent = 0;
    int64_t deadline = NowMs() + timeout_ms;
    while (sent < data.size()) {
      if (!WaitFor(POLLOUT, deadline)) return false;
      ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  /// Whatever arrives within `timeout_ms`, appended to buffer(); false on
  /// EOF or error (closed() then tells which), true when something came
  /// or the time ran out.
  bool Receive(int timeout_ms) {
    if (!WaitFor(POLLIN, NowMs() + timeout_ms)) return !closed_;
    char chunk[16384];
    ssize_t n = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) {  // EOF or reset
      closed_ = true;
      return false;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  /// Reads until the peer closes or `timeout_ms` passes; true if it closed.
  bool WaitClosed(int timeout_ms) {
    int64_t deadline = NowMs() + timeout_ms;
    while (!closed_ && NowMs() < deadline) Receive(static_cast<int>(deadline - NowMs()));
    return closed_;
  }

  /// Reads one response (header and Content-Length body) into *status and
  /// *body; false when none arrives whole within `timeout_ms`.
  bool ReadResponse(int timeout_ms, int* status, std::string* body = nullptr,
                    std::string* head = nullptr) {
    int64_t deadline = NowMs() + timeout_ms;
    while (true) {
      size_t end = buffer_.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::string h = buffer_.substr(0, end + 2);
        size_t length = 0;
        size_t cl = Lower(h).find("\r\ncontent-length:");
        if (cl != std::string::npos) length = std::stoul(h.substr(cl + 17));
        if (buffer_.size() >= end + 4 + length) {
          if (h.rfind("HTTP/1.", 0) != 0 || h.size() < 12) return false;
          *status = std::stoi(h.substr(9, 3));
          if (body != nullptr) *body = buffer_.substr(end + 4, length);
          if (head != nullptr) *head = h;
          buffer_.erase(0, end + 4 + length);
          return true;
        }
      }
      int64_t left = deadline - NowMs();
      if (left <= 0 || closed_) return false;
      if (!Receive(static_cast<int>(left)) && buffer_.find("\r\n\r\n") == std::string::npos) {
        return false;
      }
    }
  }

  std::string& buffer() { return buffer_; }
  bool closed() const { return closed_; }
  int fd() const { return fd_; }

  static std::string Lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

 private:
  bool WaitFor(short events, int64_t deadline) {
    if (fd_ < 0) return false;
    while (true) {
      int64_t left = deadline - NowMs();
      if (left < 0) left = 0;
      pollfd p{fd_, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(left));
      if (r > 0) {
        if ((p.revents & POLLNVAL) != 0) return false;
        // For a read, an error or hang-up is for recv to report.
        if ((p.revents & (POLLERR | POLLHUP)) != 0 && (events & POLLOUT) != 0) return false;
        return true;
      }
      if (r == 0 || errno != EINTR) return false;
    }
  }

  int fd_ = -1;
  bool closed_ = false;
  std::string buffer_;
};

/// The trivial handler the tests and http_attack serve: GET /healthz "ok";
/// GET /big 10 KiB of 'x'; POST /echo the body's size (and "empty" for none);
/// GET /slow?ms=N answers after N ms; anything else 404.
inline Handler TrivialHandler() {
  return [](const Request& req, Response& res) {
    if (req.path == "/healthz") return res.SetContent("ok\n", "text/plain");
    if (req.path == "/big") return res.SetContent(std::string(10 * 1024, 'x'), "text/plain");
    if (req.path == "/echo") {
      return res.SetContent(req.body.empty() ? "empty" : std::to_string(req.body.size()),
                            "text/plain");
    }
    if (req.path == "/slow") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(req.Param("ms"))));
      return res.SetContent("slow\n", "text/plain");
    }
    res.status = 404;
  };
}

/// GET `path` on a fresh connection; the status, or -1 when no response came
/// within `timeout_ms`. *latency_ms gets the time taken.
inline int Get(int port, const std::string& path, int timeout_ms = 1000,
               int64_t* latency_ms = nullptr, std::string* body = nullptr) {
  int64_t start = NowMs();
  RawClient c(port);
  int status = -1;
  if (c.connected() &&
      c.Send("GET " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", timeout_ms)) {
    if (!c.ReadResponse(timeout_ms, &status, body)) status = -1;
  }
  if (latency_ms != nullptr) *latency_ms = NowMs() - start;
  return status;
}

}  // namespace idem::http::testing
