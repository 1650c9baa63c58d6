// payments: the idem front end with the simulated payment providers.
//
//   payments [--db PATH] [--ledger PATH] [--hold-lifetime SECONDS]
//            [--fault TOOL=MODE[@N]]... COMMAND ...
//
// Every idem subcommand works (run, status, approvals, approve, reject,
// recover, ...); the tools are the five of providers.h, their operations
// recorded in the ledger (default: `<db path>.ledger.sqlite`). See README.md.

#include <string>
#include <vector>

#include "cli/cli.h"
#include "examples/payments/providers.h"

#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  std::string ledger_path;
  int64_t hold_lifetime_s = 7LL * 24 * 3600;
  std::vector<std::string> faults;

  idem::cli::FrontendConfig config;
  config.program = "payments";
  config.description =
      "payments: authorize, approve by policy, capture (or void) a card payment as an idem saga "
      "against simulated providers";
  config.add_options = [&](CLI::App& app) {
    app.add_option("--ledger", ledger_path,
                   "the providers' ledger (default: <db path>.ledger.sqlite)")
        ->envname("PAYMENTS_LEDGER");
    app.add_option("--hold-lifetime", hold_lifetime_s, "how long a hold lives, in seconds")
        ->check(CLI::Range(int64_t{1}, int64_t{30} * 24 * 3600));
    app.add_option("--fault", faults,
                   "inject a fault: TOOL=MODE[@N], MODE one of lose_response, lose_request, "
                   "fail, reject; repeatable")
        ->allow_extra_args(false);
  };
  config.register_tools = [&](idem::ToolRegistry& registry,
                              const idem::cli::Context& context) -> idem::Status {
    idem::payments::ProviderOptions options;
    bool postgres = context.db_path.rfind("postgresql://", 0) == 0 ||
                    context.db_path.rfind("postgres://", 0) == 0;
    std::string fallback = postgres ? "payments-ledger.sqlite" : context.db_path + ".ledger.sqlite";
    options.ledger_path = ledger_path.empty() ? fallback : ledger_path;
    options.hold_lifetime_ms = hold_lifetime_s * 1000;
    options.faults = faults;
    return idem::payments::RegisterPaymentTools(registry, options);
  };
  return idem::cli::RunCli(argc, argv, config);
}
