// payments-ledger: what the simulated payment providers applied, and the
// ledger checker (providers.h, CheckLedger).
//
//   payments-ledger --ledger PATH show      the operations, in order
//   payments-ledger --ledger PATH check [--open SAGA_ID]...
//       exit 0 when the ledger keeps the payment rules, 1 with one line per
//       violation; --open names a saga still running (its hold may be open).

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "examples/payments/providers.h"

#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"payments-ledger: the payment providers' ledger and its checker"};
  std::string path;
  std::vector<std::string> open;
  app.add_option("--ledger", path, "the ledger file")->required()->envname("PAYMENTS_LEDGER");
  app.require_subcommand(1);
  auto* show = app.add_subcommand("show", "print the operations in the order applied");
  auto* check = app.add_subcommand("check", "check the payment rules (exit 1 on a violation)");
  check->add_option("--open", open, "a saga still running: its hold may be open");
  CLI11_PARSE(app, argc, argv);

  auto ledger = idem::payments::Ledger::Open(path, /*create=*/false);
  if (!ledger.ok()) {
    std::cerr << "error: " << ledger.status().message() << "\n";
    return 2;
  }
  auto ops = (*ledger)->Ops();
  if (!ops.ok()) {
    std::cerr << "error: " << ops.status().message() << "\n";
    return 1;
  }
  if (*show) {
    std::cout << idem::payments::FormatOps(*ops);
    return 0;
  }
  auto f = idem::payments::CheckLedger(*ops, std::set<std::string>(open.begin(), open.end()));
  std::cout << "payments ledger: " << f.holds << " hold(s), " << f.captures << " capture(s), "
            << f.voids << " void(s), " << f.refunds << " refund(s), " << f.receipts
            << " receipt(s): " << (f.ok() ? "ok" : "VIOLATIONS") << "\n";
  for (const auto& v : f.violations) std::cout << "  " << v << "\n";
  return f.ok() ? 0 : 1;
}
