#pragma once
// The attacks of issue 12 on an HTTP front, parameterised by size, so that
// http_server_test runs them small and http_attack (`make http-attack`) at
// full size, while a Prober measures how /healthz fares meanwhile.
//
// Thread safety: each function opens its own connections; a Prober runs on
// a thread of its own.

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/http_test_client.h"

namespace idem::http::testing {

/// Probes GET /healthz (1 s deadline, fresh connection) every 50 ms until stopped.
class Prober {
 public:
  explicit Prober(int port) : port_(port), thread_([this] { Run(); }) {}
  ~Prober() { Stop(); }
  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int probes() const { return probes_; }
  int failures() const { return failures_; }
  /// The slowest probe (a failed probe counts as its time taken).
  int64_t max_latency_ms() const { return Percentile(1.0); }
  int64_t Percentile(double p) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (latencies_.empty()) return 0;
    std::vector<int64_t> sorted = latencies_;
    std::sort(sorted.begin(), sorted.end());
    size_t i = static_cast<size_t>(p * static_cast<double>(sorted.size() - 1));
    return sorted[i];
  }

 private:
  // At least one probe, even when Stop comes before the thread first runs
  // (a fast attack): a check on probes() > 0 must not race the scheduler.
  void Run() {
    do {
      int64_t latency = 0;
      int status = Get(port_, "/healthz", 1000, &latency);
      ++probes_;
      if (status != 200) ++failures_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        latencies_.push_back(latency);
      }
      if (done_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (!done_);
  }

  const int port_;
  std::atomic<bool> done_{false};
  std::atomic<int> probes_{0};
  std::atomic<int> failures_{0};
  mutable std::mutex mu_;
  std::vector<int64_t> latencies_;  // guarded by mu_
  std::thread thread_;
};

/// Sends `head`, then `unit` again and again until the server answers, stops
/// taking bytes, or `max_bytes` are sent. The answer's status (-1 for none)
/// and the bytes sent.
struct FloodResult {
  int status = -1;
  size_t sent = 0;
};
inline FloodResult Flood(int port, const std::string& head, const std::string& unit,
                         size_t max_bytes) {
  FloodResult r;
  RawClient c(port);
  if (!c.Send(head)) return r;
  r.sent = head.size();
  while (r.sent < max_bytes && c.Send(unit, 1000)) {
    r.sent += unit.size();
    c.Receive(0);
    if (!c.buffer().empty()) break;
  }
  if (!c.ReadResponse(2000, &r.status)) r.status = -1;
  return r;
}

/// Attack 2: a chunked POST of up to `max_bytes` to `path`, without a token.
inline FloodResult ChunkedBody(int port, size_t max_bytes, const std::string& path = "/echo") {
  return Flood(port, "POST " + path + " HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
               "4000\r\n" + std::string(0x4000, 'a') + "\r\n", max_bytes);
}

/// Attack 3: `clients` requests at once, each of up to `max_bytes` of 8 KiB
/// header lines. The statuses.
inline std::vector<int> HeaderLines(int port, int clients, size_t max_bytes) {
  std::vector<int> statuses(static_cast<size_t>(clients), -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      statuses[static_cast<size_t>(i)] =
          Flood(port, "GET /healthz HTTP/1.1\r\nHost: t\r\n",
                "X-Pad: " + std::string(8 * 1024 - 9, 'p') + "\r\n", max_bytes)
              .status;
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

/// Attack 1: `connections` clients that each send a request one byte every
/// `interval_ms`, reconnecting when cut, for `duration_ms`. The longest any
/// connection was held open, and how many times the server cut one.
struct SlowResult {
  int64_t longest_hold_ms = 0;
  int cuts = 0;
};
inline SlowResult Slowloris(int port, int connections, int64_t duration_ms, int64_t interval_ms) {
  static const std::vector<std::string> kRequests = {
      // header, with and without a token; body by Content-Length and chunked
      "GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: " + std::string(400, 'a') + "\r\n",
      "GET /healthz HTTP/1.1\r\nAuthorization: Bearer " + std::string(400, 'f') + "\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'b'),
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n" +
          std::string(1000, 'c')};
  std::atomic<int64_t> longest{0};
  std::atomic<int> cuts{0};
  std::vector<std::thread> threads;
  const int64_t end = NowMs() + duration_ms;
  for (int i = 0; i < connections; ++i) {
    threads.emplace_back([&, i] {
      const std::string& text = kRequests[static_cast<size_t>(i) % kRequests.size()];
      while (NowMs() < end) {
        RawClient c(port);
        const int64_t start = NowMs();
        bool cut = false;
        for (size_t k = 0; k < text.size() && NowMs() < end; ++k) {
          if (!c.Send(text.substr(k, 1), 500) || !c.Receive(static_cast<int>(interval_ms))) {
            cut = true;
            break;
          }
        }
        const int64_t held = NowMs() - start;
        if (cut) ++cuts;
        int64_t prev = longest.load();
        while (held > prev && !longest.compare_exchange_weak(prev, held)) {
        }
        if (!cut) break;  // the time is up
      }
    });
  }
  for (auto& t : threads) t.join();
  return {longest.load(), cuts.load()};
}

/// Attack 4: GET `path` with `ranges` "0-" ranges. The bytes of the answer
/// (header and body), or -1; `body_bytes` (when set) the body's alone.
inline int64_t Ranges(int port, int ranges, int* status, const std::string& path = "/big",
                      int64_t* body_bytes = nullptr) {
  std::string spec = "bytes=0-";
  for (int i = 1; i < ranges; ++i) spec += ",0-";
  RawClient c(port);
  std::string body, head;
  *status = -1;
  if (!c.Send("GET " + path + " HTTP/1.1\r\nHost: t\r\nRange: " + spec + "\r\n\r\n") ||
      !c.ReadResponse(5000, status, &body, &head)) {
    return -1;
  }
  if (body_bytes != nullptr) *body_bytes = static_cast<int64_t>(body.size());
  return static_cast<int64_t>(head.size() + 2 + body.size());
}

/// Attack 5: one request on a fresh connection; its status or -1.
inline int Once(int port, const std::string& request) {
  RawClient c(port);
  int status = -1;
  if (!c.Send(request) || !c.ReadResponse(2000, &status)) return -1;
  return status;
}
inline constexpr char kConflictingLengths[] =
    "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd";
inline constexpr char kTwoAuthorizations[] =
    "GET /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer a\r\nAuthorization: Bearer "
    "b\r\n\r\n";
inline constexpr char kPostWithoutBody[] = "POST /echo HTTP/1.1\r\nHost: t\r\n\r\n";

}  // namespace idem::http::testing
