// http_attack: the attacks of issue 12 at full size against an http::Server
// with the default limits, in this process (so /proc/self/status is the
// server's memory), printing how /healthz fared and the RSS after each.
// Built with the tests, not run by ctest: `make http-attack` (about a
// minute). `--quick` runs every attack small, to check that it works.
// `--port N [--pid P]` attacks a server already listening on 127.0.0.1:N
// instead (`make http-attack-server` starts `idem serve` for it), reading
// the RSS of process P; its range attack asks for /metrics.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "tests/http_attacks.h"

#include "http/server.h"

namespace {

using idem::http::testing::ChunkedBody;
using idem::http::testing::FloodResult;
using idem::http::testing::HeaderLines;
using idem::http::testing::kConflictingLengths;
using idem::http::testing::kPostWithoutBody;
using idem::http::testing::kTwoAuthorizations;
using idem::http::testing::NowMs;
using idem::http::testing::Once;
using idem::http::testing::Prober;
using idem::http::testing::Ranges;
using idem::http::testing::RssKb;
using idem::http::testing::Slowloris;
using idem::http::testing::SlowResult;
using idem::http::testing::TrivialHandler;

std::string g_status_file = "/proc/self/status";  // whose memory is reported

int64_t StatusKb(const char* field) {
  std::ifstream in(g_status_file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field)));
  }
  return -1;
}
int64_t CurrentRssKb() {
  return g_status_file == "/proc/self/status" ? RssKb() : StatusKb("VmRSS:");
}
int64_t PeakRssKb() { return StatusKb("VmHWM:"); }

// Runs `attack` (which returns its outcome as text) while probing /healthz.
template <typename Attack>
void Row(int port, const char* name, Attack attack) {
  Prober prober(port);
  const int64_t start = NowMs();
  std::string outcome = attack();
  const int64_t took = NowMs() - start;
  prober.Stop();
  std::printf("%-34s %-44s %6.1f s  %5d/%-5d %6lld %6lld  %7lld %7lld\n", name, outcome.c_str(),
              static_cast<double>(took) / 1000.0, prober.probes() - prober.failures(),
              prober.probes(), static_cast<long long>(prober.Percentile(0.99)),
              static_cast<long long>(prober.max_latency_ms()),
              static_cast<long long>(CurrentRssKb()), static_cast<long long>(PeakRssKb()));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int external_port = 0;  // > 0: attack a server already running there
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
      external_port = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--pid") == 0 && i + 1 < argc) {
      g_status_file = std::string("/proc/") + argv[++i] + "/status";
    } else {
      std::fprintf(stderr, "usage: http_attack [--quick] [--port N [--pid P]]\n");
      return 2;
    }
  }
  const size_t mb = quick ? 1024 : 1 << 20;  // --quick: KiB instead of MB
  idem::http::ServerOptions options;         // the defaults, as `idem serve` would run them
  if (quick) {  // small limits, so that the small attacks still pass them
    options.request_timeout_ms = 1000;
    options.max_body_bytes = size_t{64} * 1024;
    options.max_header_bytes = size_t{8} * 1024;
  }
  std::unique_ptr<idem::http::Server> own;
  int port = external_port;
  if (external_port > 0) {
    std::printf("http_attack: the server on 127.0.0.1:%d (%s)\n\n", port, g_status_file.c_str());
  } else {
    auto server = idem::http::Server::Create(options, TrivialHandler());
    if (!server.ok() || !(*server)->Start().ok()) {
      std::fprintf(stderr, "http_attack: cannot start the server\n");
      return 1;
    }
    own = std::move(server).value();
    port = own->port();
    std::printf("http_attack: idem::http::Server on 127.0.0.1:%d, %s\n", port,
                quick ? "small limits (--quick)" : "default limits");
    std::printf("  request_timeout %lld ms, max_body %zu B, max_header %zu B / %zu fields\n\n",
                static_cast<long long>(options.request_timeout_ms), options.max_body_bytes,
                options.max_header_bytes, options.max_header_fields);
  }
  const std::string ranges_path = external_port > 0 ? "/metrics" : "/big";
  std::printf("%-34s %-44s %8s  %11s %6s %6s  %7s %7s\n", "attack", "outcome", "took", "healthz ok",
              "p99ms", "maxms", "RSS KiB", "peak");
  std::printf("%-34s %-44s %8s  %11s %6s %6s  %7lld %7lld\n", "(before)", "", "", "", "", "",
              static_cast<long long>(CurrentRssKb()), static_cast<long long>(PeakRssKb()));

  const int64_t slow_ms = quick ? 3000 : 30'000;
  Row(port, quick ? "slowloris 8 conns x 3 s, 1 B/0.2 s" : "slowloris 8 conns x 30 s, 1 B/4 s",
      [&] {
        SlowResult r = Slowloris(port, 8, slow_ms, quick ? 200 : 4000);
        return "longest hold " + std::to_string(r.longest_hold_ms) + " ms, " +
               std::to_string(r.cuts) + " cut";
      });
  const size_t body = 300 * mb;
  Row(port, quick ? "chunked POST 300 KiB, no token" : "chunked POST 300 MB, no token", [&] {
    FloodResult r = ChunkedBody(port, body, external_port > 0 ? "/v1/sagas" : "/echo");
    return std::to_string(r.status) + " after " + std::to_string(r.sent / 1024) + " KiB sent";
  });
  const size_t header = 200 * mb;
  Row(port, quick ? "4 x 200 KiB of 8 KiB header lines" : "4 x 200 MB of 8 KiB header lines", [&] {
    std::string out;
    for (int s : HeaderLines(port, 4, header)) out += std::to_string(s) + " ";
    return out;
  });
  Row(port, ("2,700 Range: 0- ranges, GET " + ranges_path).c_str(), [&] {
    int status = 0;
    int64_t body_bytes = 0;
    int64_t bytes = Ranges(port, 2700, &status, ranges_path, &body_bytes);
    return std::to_string(status) + ", " + std::to_string(bytes) + " B answered (body " +
           std::to_string(body_bytes) + " B)";
  });
  Row(port, "duplicate CL / Authorization, POST", [&] {
    return "CL " + std::to_string(Once(port, kConflictingLengths)) + ", auth " +
           std::to_string(Once(port, kTwoAuthorizations)) + ", empty POST " +
           std::to_string(Once(port, kPostWithoutBody));
  });
  if (own) {
    own->Stop();
    auto stats = own->stats();
    std::printf("\naccepted %llu, refused %llu, requests %llu, rejected %llu\n",
                static_cast<unsigned long long>(stats.accepted),
                static_cast<unsigned long long>(stats.refused),
                static_cast<unsigned long long>(stats.requests),
                static_cast<unsigned long long>(stats.rejected_requests));
  }
  return 0;
}
