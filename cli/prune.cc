#include "cli/prune.h"

#include <chrono>
#include <sstream>
#include <utility>
#include <vector>

#include "saga/states.h"
#include "storage/server_state.h"

#include "common/duration.h"
#include "common/json_util.h"
#include "observability/observability.h"
#include <CLI/CLI.hpp>

namespace idem::cli {
namespace {

std::vector<std::string> TerminalStates() {
  std::vector<std::string> out;
  for (SagaState s : {SagaState::kPending, SagaState::kRunning, SagaState::kAwaitingApproval,
                      SagaState::kSucceeded, SagaState::kCompensating, SagaState::kCompensated,
                      SagaState::kFailed, SagaState::kCancelled, SagaState::kNeedsAttention,
                      SagaState::kPaused}) {
    if (IsTerminal(s)) out.push_back(SagaStateName(s));
  }
  return out;
}

Result<std::vector<std::string>> SplitFields(const std::string& list, const char* flag) {
  std::vector<std::string> out;
  if (list.empty()) return out;
  std::stringstream in(list);
  for (std::string f; std::getline(in, f, ',');) {
    if (f.empty() || f.find_first_of(" \t") != std::string::npos) {
      return Status::InvalidArgument(std::string(flag) +
                                     ": expected field names separated by commas, got \"" +
                                     PrintableText(list) + "\"");
    }
    out.push_back(f);
  }
  if (!list.empty() && list.back() == ',') {
    return Status::InvalidArgument(std::string(flag) + ": a field name is empty");
  }
  return out;
}

Json ReportJson(const storage::PruneReport& r, const storage::PruneRequest& req,
                int64_t key_records) {
  return {{"dry_run", req.dry_run},
          {"mode", req.redact.empty() ? "all" : "redact"},
          {"fields", req.redact},
          {"sagas", r.saga_ids.size()},
          {"saga_ids", r.saga_ids},
          {"steps", r.steps},
          {"journal_entries", r.journal_entries},
          {"effects", r.effects},
          {"tokens", r.tokens},
          {"key_records", key_records},
          {"batches", r.batches}};
}

// One round: the sagas, then the server's expired key records.
Result<Json> PruneOnce(const PruneFlags& flags, storage::Store* store, Clock* clock,
                       const char* flag) {
  const int64_t now = clock->NowMs();
  auto request = MakePruneRequest(flags, now, flag);
  if (!request.ok()) return request.status();
  auto keys_ms = ParseDurationMs(flags.key_records_older_than, "--key-records-older-than");
  if (!keys_ms.ok()) return keys_ms.status();
  auto report = store->Prune(*request);
  if (!report.ok()) return report.status();
  int64_t key_records = 0;
  if (!request->dry_run && store->KeyRecords() != nullptr) {
    auto purged = store->KeyRecords()->PurgeKeys(now - *keys_ms);
    if (!purged.ok()) return purged.status();
    key_records = *purged;
  }
  return ReportJson(*report, *request, key_records);
}

}  // namespace

CLI::App* AddPruneCommand(CLI::App* app, PruneFlags* f) {
  auto* prune = app->add_subcommand(
      "prune", "remove (or redact) finished sagas' inputs and results; intents stay");
  prune
      ->add_option("--older-than", f->older_than,
                   "finished sagas last updated longer ago than this: 30s, 15m, 2h, 3d")
      ->required();
  prune->add_option("--redact", f->redact,
                    "only replace these fields, at any depth (e.g. card_number,passport)");
  prune->add_option("--key-records-older-than", f->key_records_older_than,
                    "also remove serve's Idempotency-Key records older than this (default 24h)");
  prune->add_option("--batch", f->batch, "sagas per transaction (default 50)")
      ->check(CLI::Range(1, 1000));
  prune->add_flag("--dry-run", f->dry_run, "count what would be pruned, change nothing");
  prune->add_flag("--json", f->json, "JSON");
  return prune;
}

void AddBackgroundPruneFlags(CLI::App* command, PruneFlags* f) {
  command->add_option("--prune-older-than", f->older_than,
                      "prune finished sagas older than this in the background (default: off)");
  command->add_option("--prune-redact", f->redact,
                      "background pruning only redacts these fields (comma-separated)");
  command->add_option("--prune-every", f->every, "how often the background pruning runs (1h)");
}

Result<storage::PruneRequest> MakePruneRequest(const PruneFlags& flags, int64_t now_ms,
                                               const char* older_than_flag) {
  auto older = ParseDurationMs(flags.older_than, older_than_flag);
  if (!older.ok()) return older.status();
  const bool background = std::string(older_than_flag) != "--older-than";
  auto fields = SplitFields(flags.redact, background ? "--prune-redact" : "--redact");
  if (!fields.ok()) return fields.status();
  storage::PruneRequest r;
  r.finished_before_ms = now_ms - *older;
  r.states = TerminalStates();
  r.redact = std::move(fields).value();
  r.dry_run = flags.dry_run;
  r.batch_sagas = flags.batch;
  r.now_ms = now_ms;
  return r;
}

Status RunPrune(const PruneFlags& flags, storage::Store* store, Clock* clock, std::FILE* out) {
  auto done = PruneOnce(flags, store, clock, "--older-than");
  if (!done.ok()) return done.status();
  const Json& r = *done;
  if (flags.json) {
    std::fprintf(out, "%s\n", r.dump().c_str());
    return Status::Ok();
  }
  std::fprintf(out,
               "%s %zu saga(s) (%s): %lld step row(s), %lld journal entr%s, %lld effect(s), "
               "%lld consumed token(s), %lld key record(s), in %d batch(es)\n",
               flags.dry_run ? "would prune" : "pruned", r["saga_ids"].size(),
               r["mode"] == "all" ? "inputs and results" : ("redacted: " + flags.redact).c_str(),
               static_cast<long long>(r["steps"].get<int64_t>()),
               static_cast<long long>(r["journal_entries"].get<int64_t>()),
               r["journal_entries"].get<int64_t>() == 1 ? "y" : "ies",
               static_cast<long long>(r["effects"].get<int64_t>()),
               static_cast<long long>(r["tokens"].get<int64_t>()),
               static_cast<long long>(r["key_records"].get<int64_t>()), r["batches"].get<int>());
  return Status::Ok();
}

Result<std::unique_ptr<BackgroundPruner>> BackgroundPruner::Start(const PruneFlags& flags,
                                                                  storage::Store* store,
                                                                  Clock* clock) {
  // Checked now, so that a bad flag stops the command at start.
  auto request = MakePruneRequest(flags, clock->NowMs(), "--prune-older-than");
  if (!request.ok()) return request.status();
  auto every = ParseDurationMs(flags.every, "--prune-every");
  if (!every.ok()) return every.status();
  if (*every <= 0) return Status::InvalidArgument("--prune-every: must be positive");
  std::unique_ptr<BackgroundPruner> p(new BackgroundPruner());
  p->flags_ = flags;
  p->flags_.dry_run = false;
  p->store_ = store;
  p->clock_ = clock;
  p->every_ms_ = *every;
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

BackgroundPruner::~BackgroundPruner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackgroundPruner::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    auto done = PruneOnce(flags_, store_, clock_, "--prune-older-than");
    if (done.ok()) {
      if ((*done)["sagas"].get<size_t>() > 0 || (*done)["key_records"].get<int64_t>() > 0) {
        Json fields = *done;
        fields.erase("saga_ids");
        observability::Log(observability::LogLevel::kInfo, "pruned", fields);
      }
    } else {
      observability::Log(observability::LogLevel::kWarn, "prune failed",
                         {{"error", done.status().ToString()}});
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(every_ms_), [this] { return stop_; });
  }
}

}  // namespace idem::cli
