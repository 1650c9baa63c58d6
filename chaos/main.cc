// idem-chaos: the random-kill sweep and the ledger checker (docs/reliability.md).
//
//   idem-chaos sweep [--seed N] [--sagas N] [--store sqlite|postgres|both]
//                    [--pg-restarts N] [--min-kills N] [--work DIR] [--keep]
//   idem-chaos plan  [--seed N] [--sagas N] [--store ...]   the plan and its digest
//   idem-chaos check --store LOCATOR [--store LOCATOR...] --ledger PATH
//                    [--ledger PATH...] [--acked FILE] [--audit FILE]
//                    [--after-resolve]
//
// Exit codes: 0 no finding; 1 findings (the table says which); 2 bad usage;
// 3 the sweep could not run, or ran fewer SIGKILLs than --min-kills.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "chaos/checker.h"
#include "chaos/report.h"
#include "chaos/runner.h"
#include "chaos/schedule.h"
#include <CLI/CLI.hpp>
#include <sys/stat.h>
#include <unistd.h>

namespace chaos = idem::chaos;

namespace {

int CmdCheck(const std::vector<std::string>& stores, const std::vector<std::string>& ledgers,
             const std::string& acked, const std::string& audit, bool after_resolve) {
  auto data = chaos::LoadCheckData(stores, ledgers, acked, audit);
  if (!data.ok()) {
    std::fprintf(stderr, "error: %s\n", data.status().ToString().c_str());
    return 2;
  }
  chaos::StoreReport r;
  r.store = "store";
  r.check = chaos::Check(*data, {after_resolve});
  for (const auto& store : stores) std::printf("store %s\n", store.c_str());
  std::printf("%s", chaos::FormatTable({r}).c_str());
  std::printf("%s", chaos::FormatFindings({r}).c_str());
  std::printf("%s", chaos::FormatFigures({r}).c_str());
  return r.check.ok() ? 0 : 1;
}

std::vector<bool> Stores(const std::string& which) {
  if (which == "sqlite") return {false};
  if (which == "postgres") return {true};
  return {false, true};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"idem-chaos: the random-kill sweep and the ledger checker"};
  app.require_subcommand(1);

  uint64_t seed = 0;
  int sagas = 25;
  int pg_restarts = 2;
  int min_kills = 0;
  std::string which = "both";
  std::string work;
  bool keep = false;
  bool verbose = false;
  std::string travel_booking = IDEM_BINARY_DIR "/examples/travel_booking/travel-booking";
  std::string travel_providers = IDEM_BINARY_DIR "/examples/travel_booking/travel-providers";
  std::string idem_binary = IDEM_BINARY_DIR "/idem";
  std::string source = IDEM_SOURCE_DIR;

  auto add_plan_options = [&](CLI::App* c) {
    c->add_option("--seed", seed, "the seed (default: drawn from the clock, and printed)");
    c->add_option("--sagas", sagas, "sagas per store")->check(CLI::Range(1, 1000000));
    c->add_option("--store", which, "sqlite, postgres or both")
        ->check(CLI::IsMember({"sqlite", "postgres", "both"}));
    c->add_option("--pg-restarts", pg_restarts, "PostgreSQL restarts (exactly)")
        ->check(CLI::Range(0, 100000));
  };
  auto* sweep = app.add_subcommand("sweep", "run the sweep, then the checker, per store");
  add_plan_options(sweep);
  sweep->add_option("--min-kills", min_kills, "fail (exit 3) with fewer SIGKILLs per store");
  sweep->add_option("--work", work, "work directory (default: a fresh one in $TMPDIR)");
  sweep->add_flag("--keep", keep, "keep the work directory (kept anyway on findings)");
  sweep->add_flag("--verbose", verbose, "one line per process");
  sweep->add_option("--travel-booking", travel_booking, "the travel-booking binary");
  sweep->add_option("--source", source, "the source tree (specs, scripts)");
  sweep->add_option("--idem", idem_binary, "the idem binary (`serve`)");
  sweep->add_option("--travel-providers", travel_providers, "the providers' HTTP server");
  auto* plan_cmd = app.add_subcommand("plan", "print the plan and its digest, run nothing");
  add_plan_options(plan_cmd);

  std::string acked, audit;
  std::vector<std::string> check_stores, ledgers;
  bool after_resolve = false;
  auto* check = app.add_subcommand("check", "check a journal against the providers' ledger(s)");
  check
      ->add_option("--store", check_stores,
                   "a journal: a SQLite file or postgresql://... (repeatable)")
      ->required();
  check->add_option("--ledger", ledgers, "a providers' ledger (repeatable)")->required();
  check->add_option("--acked", acked, "the sagas acknowledged to clients (SAGA_ID INTENT_KEY)");
  check->add_option("--audit", audit,
                    "the journal audit (SEQ, SAGA, EVENT, WRITER, OWNER per line, tab-separated)");
  check->add_flag("--after-resolve", after_resolve,
                  "a person has been through: sagas still waiting for one are findings");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*check) return CmdCheck(check_stores, ledgers, acked, audit, after_resolve);

  if (seed == 0) seed = static_cast<uint64_t>(std::time(nullptr)) ^ (uint64_t(getpid()) << 32);
  if (*plan_cmd) {
    for (bool pg : Stores(which)) {
      chaos::Plan p = chaos::MakePlan({seed, sagas, pg, pg_restarts});
      std::printf("%s", p.Text().c_str());
      std::printf("digest %s %s\n", pg ? "postgres" : "sqlite", p.Digest().c_str());
    }
    return 0;
  }

  bool made_work = false;
  if (work.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/idem-chaos.XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      return 3;
    }
    work = tmpl;
    made_work = true;
  } else {
    std::filesystem::create_directories(work);
  }
  // The PostgreSQL server runs as `postgres` when we are root: it must be
  // able to reach its folder.
  chmod(work.c_str(), 0755);
  std::printf("idem-chaos: seed %llu, %d sagas per store, work dir %s\n",
              static_cast<unsigned long long>(seed), sagas, work.c_str());
  std::printf("replay: idem-chaos sweep --seed %llu --sagas %d --store %s --pg-restarts %d\n",
              static_cast<unsigned long long>(seed), sagas, which.c_str(), pg_restarts);
  std::fflush(stdout);

  std::vector<chaos::StoreReport> reports;
  bool broken = false;
  for (bool pg : Stores(which)) {
    chaos::Plan plan = chaos::MakePlan({seed, sagas, pg, pg_restarts});
    chaos::StoreReport r;
    r.store = pg ? "postgres" : "sqlite";
    r.digest = plan.Digest();
    std::printf("%s: plan %s\n", r.store.c_str(), r.digest.c_str());
    std::fflush(stdout);
    chaos::RunnerConfig cfg;
    cfg.travel_booking = travel_booking;
    cfg.idem = idem_binary;
    cfg.travel_providers = travel_providers;
    cfg.source_dir = source;
    cfg.work_dir = work + "/" + r.store;
    cfg.verbose = verbose;
    // The end phase's bound grows with the sweep: the person decides for
    // about one saga in three, each decision a process or a request.
    cfg.settle_timeout_s = std::max(180, 2 * sagas);
    chaos::Runner runner(cfg, plan);
    idem::Status s = runner.Execute();
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", r.store.c_str(), s.ToString().c_str());
      broken = true;
      continue;
    }
    auto data = chaos::LoadCheckData(runner.locators(), {runner.ledger()}, runner.acked_file(),
                                     runner.audit_file());
    runner.Shutdown();
    if (!data.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", r.store.c_str(), data.status().ToString().c_str());
      broken = true;
      continue;
    }
    r.check = chaos::Check(*data, {/*after_resolve=*/true});
    r.stats = runner.stats();
    r.ran = true;
    if (r.stats.TotalKills() < min_kills) {
      std::fprintf(stderr, "error: %s: %d SIGKILLs, fewer than --min-kills %d\n", r.store.c_str(),
                   r.stats.TotalKills(), min_kills);
      broken = true;
    }
    reports.push_back(std::move(r));
  }
  std::printf("\nseed %llu\n%s", static_cast<unsigned long long>(seed),
              chaos::FormatTable(reports).c_str());
  std::printf("%s", chaos::FormatFindings(reports).c_str());
  std::printf("%s", chaos::FormatFigures(reports).c_str());
  bool clean = true;
  for (const auto& r : reports) clean = clean && r.check.ok();
  if (made_work && clean && !broken && !keep) {
    std::filesystem::remove_all(work);
  } else {
    std::printf("work dir kept: %s\n", work.c_str());
  }
  if (broken) return 3;
  return clean ? 0 : 1;
}
