// payment-providers: the simulated payment providers as an HTTP server.
//
//   payment-providers --listen 127.0.0.1:8092 --ledger PATH
//                     [--hold-lifetime SECONDS] [--fault TOOL=MODE[@N]]...
//
// Serves the five tools (routes in http_providers.h) and prints
// `listening on http://HOST:PORT` once it accepts; SIGINT or SIGTERM stops
// it. Point idem at it with examples/payments/tools.http.json. Exit codes: 0
// stopped by a signal, 1 the server failed, 2 bad usage.

#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "examples/payments/http_providers.h"

#include <CLI/CLI.hpp>
#include <pthread.h>

int main(int argc, char** argv) {
  CLI::App app{"payment-providers: the simulated payment providers over HTTP"};
  std::string listen = "127.0.0.1:8092";
  idem::payments::ProviderOptions options;
  int64_t hold_lifetime_s = 7LL * 24 * 3600;
  app.add_option("--listen", listen, "HOST:PORT (port 0: an ephemeral port)");
  app.add_option("--ledger", options.ledger_path, "the ledger file")->required();
  app.add_option("--hold-lifetime", hold_lifetime_s, "how long a hold lives, in seconds")
      ->check(CLI::Range(int64_t{1}, int64_t{30} * 24 * 3600));
  app.add_option("--fault", options.faults, "TOOL=MODE[@N]; repeatable");
  CLI11_PARSE(app, argc, argv);
  options.hold_lifetime_ms = hold_lifetime_s * 1000;
  const auto colon = listen.rfind(':');
  int port = -1;
  try {
    if (colon != std::string::npos) port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (colon == std::string::npos || colon == 0 || port < 0 || port > 65535) {
    std::cerr << "error: --listen " << listen << ": expected HOST:PORT\n";
    return 2;
  }
  const std::string host = listen.substr(0, colon);

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // the server threads inherit it

  auto server = idem::payments::HttpPaymentProviders::Create(options);
  if (!server.ok()) {
    std::cerr << "error: " << server.status().message() << "\n";
    return server.status().code() == idem::Code::kInvalidArgument ? 2 : 1;
  }
  auto bound = (*server)->Start(host, port);
  if (!bound.ok()) {
    std::cerr << "error: " << bound.status().message() << "\n";
    return 1;
  }
  std::cout << "listening on http://" << host << ":" << *bound << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  (*server)->Stop();
  return 0;
}
