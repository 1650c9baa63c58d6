// travel-providers: the simulated travel providers as HTTP servers.
//
//   travel-providers --listen 127.0.0.1:8091 --ledger PATH [--keys PATH]
//                    [--latency-ms N] [--fault TOOL=MODE[@N]]...
//                    [--lost-response-hold-ms MS]
//                    [--tls-cert PATH --tls-key PATH]
//
// Serves the eight travel tools on one port (routes in http_providers.h) and
// prints `listening on http://HOST:PORT` (https:// with --tls-cert/--tls-key)
// once it accepts (port 0: an
// ephemeral port, printed). SIGINT or SIGTERM stops it. Point idem at it with
// examples/travel_booking/tools.http.json. Exit codes: 0 stopped by a signal,
// 1 the server failed, 2 bad usage.

#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "examples/travel_booking/http_providers.h"

#include <CLI/CLI.hpp>
#include <pthread.h>
#include <unistd.h>

namespace {

/// Splits "HOST:PORT" ("[::1]:PORT" for IPv6).
bool ParseListen(const std::string& text, std::string* host, int* port) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size()) return false;
  *host = text.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  const std::string digits = text.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *port = std::stoi(digits);
  return *port <= 65535;
}

int Main(int argc, char** argv) {
  std::string listen = "127.0.0.1:8091";
  idem::travel::HttpProviderOptions options;
  std::vector<std::string> fault_texts;

  CLI::App app(
      "travel-providers: the simulated travel providers (flights, hotels, cars, "
      "payments, transfers) as HTTP servers on one port");
  app.add_option("--listen", listen, "HOST:PORT to serve on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--ledger", options.ledger_path, "the providers' effect ledger (SQLite)")
      ->required()
      ->envname("TRAVEL_LEDGER");
  app.add_option("--keys", options.keys_path,
                 "the Idempotency-Key store of flights and payments (default: "
                 "<ledger>.keys.sqlite)");
  app.add_option("--latency-ms", options.latency_ms, "simulated latency of every commit")
      ->check(CLI::Range(0, 600'000));
  app.add_option("--fault", fault_texts,
                 "inject a fault: TOOL=MODE[@N], MODE one of fail, fail_times(K), reject, "
                 "lose_request, lose_response, drop_connection, delay(MS), reprice; repeatable")
      ->allow_extra_args(false);
  app.add_option("--confirm-delay-ms", options.confirm_delay_ms,
                 "how long the slow provider (transfers.book) takes to finish a call it "
                 "accepted")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  app.add_option("--lost-response-hold-ms", options.lost_response_hold_ms,
                 "how long a lose_response answer is withheld (past the client's timeout)")
      ->capture_default_str()
      ->check(CLI::Range(0, 600'000));
  app.add_option("--tls-cert", options.tls_cert_file,
                 "serve HTTPS: a PEM certificate chain (with --tls-key)");
  app.add_option("--tls-key", options.tls_key_file,
                 "serve HTTPS: its PEM private key, owner-only (with --tls-cert)");
  CLI11_PARSE(app, argc, argv);

  std::string host;
  int port = 0;
  if (!ParseListen(listen, &host, &port)) {
    std::cerr << "travel-providers: --listen " << listen << ": expected HOST:PORT\n";
    return 2;
  }
  for (const auto& text : fault_texts) {
    auto rule = idem::travel::ParseHttpFaultRule(text);
    if (!rule.ok()) {
      std::cerr << "travel-providers: " << rule.status().message() << "\n";
      return 2;
    }
    options.faults.push_back(*rule);
  }

  // Signals go to one waiting thread, which stops the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto providers = idem::travel::HttpProviders::Create(options);
  if (!providers.ok()) {
    std::cerr << "travel-providers: " << providers.status().ToString() << "\n";
    const idem::Code code = providers.status().code();
    const bool tls_flag = providers.status().message().find("--tls-") != std::string::npos;
    return code == idem::Code::kInvalidArgument || tls_flag ? 2 : 1;
  }
  auto bound = (*providers)->Bind(host, port);
  if (!bound.ok()) {
    std::cerr << "travel-providers: " << bound.status().ToString() << "\n";
    return 1;
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    (*providers)->Stop();
  });
  std::cout << "listening on " << (options.tls_cert_file.empty() ? "http://" : "https://") << host
            << ":" << *bound << std::endl;
  idem::Status served = (*providers)->Run();
  if (!served.ok()) {
    std::cerr << "travel-providers: " << served.ToString() << "\n";
    ::kill(::getpid(), SIGTERM);  // ends the waiter's sigwait
    waiter.join();
    return 1;
  }
  waiter.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "travel-providers: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
