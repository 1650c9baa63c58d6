// travel-booking: the idem front end with the simulated travel providers.
//
//   travel-booking [--db PATH] [--ledger PATH] [--latency-ms N]
//                  [--confirm-delay-ms N] [--fault TOOL=MODE[@N]]... COMMAND ...
//
// Every idem subcommand works (run, status, list, recover, ...); the tools are
// the ten travel tools of providers.h, with their effects recorded in the
// ledger (default: `<db path>.ledger.sqlite`). See README.md.

#include <string>
#include <vector>

#include "cli/cli.h"
#include "examples/travel_booking/providers.h"

#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  std::string ledger_path;
  int latency_ms = 0;
  int64_t confirm_delay_ms = idem::travel::ProviderOptions().confirm_delay_ms;
  std::vector<std::string> fault_texts;

  idem::cli::FrontendConfig config;
  config.program = "travel-booking";
  config.description =
      "travel-booking: book a trip (flight, hotel, car, transfer, payment) as an idem saga "
      "against "
      "simulated providers";
  config.add_options = [&](CLI::App& app) {
    app.add_option("--ledger", ledger_path,
                   "the providers' effect ledger (default: <db path>.ledger.sqlite)")
        ->envname("TRAVEL_LEDGER");
    app.add_option("--latency-ms", latency_ms, "simulated latency of every provider call")
        ->check(CLI::Range(0, 600'000));
    app.add_option("--confirm-delay-ms", confirm_delay_ms,
                   "how long the slow provider (transfers.book) takes to finish a call it "
                   "accepted (default 3000)")
        ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
    app.add_option("--fault", fault_texts,
                   "inject a fault: TOOL=MODE[@N], MODE one of fail, fail_times(K), reject, "
                   "lose_request, lose_response, delay(MS), reprice, decline; repeatable")
        ->allow_extra_args(false);
  };
  config.register_tools = [&](idem::ToolRegistry& registry,
                              const idem::cli::Context& context) -> idem::Status {
    idem::travel::ProviderOptions options;
    bool postgres = context.db_path.rfind("postgresql://", 0) == 0 ||
                    context.db_path.rfind("postgres://", 0) == 0;
    // On PostgreSQL (several workers, one journal) the default ledger is one
    // shared file in the working folder.
    std::string fallback = postgres ? "travel-ledger.sqlite" : context.db_path + ".ledger.sqlite";
    options.ledger_path = ledger_path.empty() ? fallback : ledger_path;
    options.latency_ms = latency_ms;
    options.confirm_delay_ms = confirm_delay_ms;
    for (const auto& text : fault_texts) {
      auto rule = idem::travel::ParseFaultRule(text);
      if (!rule.ok()) return rule.status();
      options.faults.push_back(*rule);
    }
    return idem::travel::RegisterTravelTools(registry, options);
  };
  return idem::cli::RunCli(argc, argv, config);
}
