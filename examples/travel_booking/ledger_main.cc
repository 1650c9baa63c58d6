// travel-ledger: prints the travel providers' ledger and checks it.
//
//   travel-ledger PATH            the effects, as a table
//   travel-ledger PATH --calls    also every call received
//   travel-ledger PATH --json     effects, calls and duplicates as JSON
//   travel-ledger PATH --check    exits 1 when an effect was applied twice
//
// Exit codes: 0 fine; 1 duplicates found (with --check); 2 bad usage or no
// ledger at PATH; 3 the ledger could not be read.

#include <exception>
#include <iostream>
#include <string>

#include "examples/travel_booking/providers.h"

#include <CLI/CLI.hpp>

namespace {

constexpr int kExitOk = 0;
constexpr int kExitDuplicates = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreadable = 3;

idem::Json ToJson(const idem::travel::LedgerEffect& e) {
  return {{"id", e.id},
          {"provider", e.provider},
          {"operation", e.operation},
          {"idempotency_key", e.idempotency_key},
          {"applied_at", e.applied_at},
          {"args", e.args},
          {"result", e.result}};
}

idem::Json ToJson(const idem::travel::LedgerCall& c) {
  return {{"id", c.id},
          {"provider", c.provider},
          {"operation", c.operation},
          {"idempotency_key", c.idempotency_key},
          {"at", c.at},
          {"outcome", c.outcome}};
}

idem::Json ToJson(const idem::travel::DuplicateEffect& d) {
  return {{"provider", d.provider},
          {"operation", d.operation},
          {"idempotency_key", d.idempotency_key},
          {"count", d.count}};
}

int Fail(const idem::Status& status) {
  std::cerr << "travel-ledger: " << status.ToString() << "\n";
  return status.code() == idem::Code::kNotFound ? kExitUsage : kExitUnreadable;
}

int Main(int argc, char** argv) {
  CLI::App app("travel-ledger: the simulated travel providers' effect ledger", "travel-ledger");
  std::string path;
  bool check = false;
  bool json = false;
  bool calls = false;
  app.add_option("path", path, "the ledger file (travel-booking --ledger)")->required();
  app.add_flag("--check", check,
               "exit 1 if any (provider, operation, idempotency_key) has more than one effect");
  app.add_flag("--json", json, "print effects, calls and duplicates as JSON");
  app.add_flag("--calls", calls, "also print every call the providers received");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  auto ledger = idem::travel::Ledger::Open(path, /*create=*/false);
  if (!ledger.ok()) return Fail(ledger.status());
  auto effects = (*ledger)->Effects();
  if (!effects.ok()) return Fail(effects.status());
  auto duplicates = (*ledger)->Duplicates();
  if (!duplicates.ok()) return Fail(duplicates.status());

  if (json) {
    auto all_calls = (*ledger)->Calls();
    if (!all_calls.ok()) return Fail(all_calls.status());
    idem::Json doc = {{"path", path},
                      {"effects", idem::Json::array()},
                      {"calls", idem::Json::array()},
                      {"duplicates", idem::Json::array()}};
    for (const auto& e : *effects) doc["effects"].push_back(ToJson(e));
    for (const auto& c : *all_calls) doc["calls"].push_back(ToJson(c));
    for (const auto& d : *duplicates) doc["duplicates"].push_back(ToJson(d));
    std::cout << doc.dump(2) << "\n";
  } else {
    std::cout << idem::travel::FormatEffectsTable(*effects);
    std::cout << effects->size() << (effects->size() == 1 ? " effect" : " effects") << "\n";
    if (calls) {
      auto all_calls = (*ledger)->Calls();
      if (!all_calls.ok()) return Fail(all_calls.status());
      std::cout << "\n" << idem::travel::FormatCallsTable(*all_calls);
      std::cout << all_calls->size() << (all_calls->size() == 1 ? " call" : " calls") << "\n";
    }
  }

  if (!check) return kExitOk;
  if (duplicates->empty()) {
    if (!json) std::cout << "check: no effect applied twice\n";
    return kExitOk;
  }
  for (const auto& d : *duplicates) {
    std::cerr << "DUPLICATE: " << d.provider << "." << d.operation << " key " << d.idempotency_key
              << " applied " << d.count << " times\n";
  }
  return kExitDuplicates;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "travel-ledger: " << e.what() << "\n";
    return kExitUnreadable;
  }
}
