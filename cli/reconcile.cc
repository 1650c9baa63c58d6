#include "cli/reconcile.h"

#include <cstdio>
#include <string>

#include "cli/cli.h"
#include "saga/reconcile.h"

#include "common/clock.h"
#include "common/duration.h"
#include "common/json_util.h"
#include "observability/observability.h"
#include <CLI/CLI.hpp>

namespace idem::cli {

int CmdReconcile(const std::string& since, bool json, const ToolRegistry& tools,
                 storage::Store* store) {
  auto window = ParseDurationMs(since, "--since");
  if (!window.ok()) {
    std::fprintf(stderr, "error: %s\n", window.status().message().c_str());
    return kExitUsage;
  }
  reconcile::DriftOptions options;
  options.since_ms = SystemClock::Get()->NowMs() - *window;
  options.observer = observability::WithJournalLog(nullptr);
  auto report = reconcile::FindDrift(store, tools, options);
  if (!report.ok()) {
    std::fprintf(stderr, "error: reconcile: %s\n", report.status().ToString().c_str());
    return kExitInternal;
  }
  if (json) {
    Json drifts = Json::array();
    for (const reconcile::Drift& d : report->drifts) {
      drifts.push_back({{"kind", d.finding.kind},
                        {"tool", d.finding.tool},
                        {"key", d.finding.key},
                        {"saga_id", d.finding.saga_id},
                        {"step", d.finding.step_id},
                        {"detail", d.finding.detail},
                        {"new", d.recorded_now}});
    }
    Json doc = {{"checked", report->checked},
                {"skipped", report->skipped},
                {"listed", report->listed},
                {"drift", drifts},
                {"errors", report->errors}};
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("%-15s %-20s %-50s %s\n", "KIND", "TOOL", "KEY", "NEW");
    for (const reconcile::Drift& d : report->drifts) {
      std::printf("%-15s %-20s %-50s %s\n", d.finding.kind.c_str(), d.finding.tool.c_str(),
                  d.finding.key.c_str(), d.recorded_now ? "yes" : "no");
    }
    for (const std::string& e : report->errors) std::fprintf(stderr, "warning: %s\n", e.c_str());
    std::printf(
        "reconcile: %d effect(s) checked, %d provider effect(s) listed, %d skipped "
        "(no status lookup), %zu drift(s)\n",
        report->checked, report->listed, report->skipped, report->drifts.size());
  }
  if (!report->drifts.empty()) return kExitDrift;
  return report->errors.empty() ? kExitOk : kExitInternal;
}

void AddBackgroundReconcileFlags(CLI::App* command, ReconcileFlags* f) {
  command->add_option("--reconcile-every", f->every,
                      "run the drift job (idem reconcile) this often in the background, e.g. 1h "
                      "(default: off)");
  command->add_option("--reconcile-since", f->since,
                      "how far back each background drift round looks (7d)");
}

Result<std::unique_ptr<BackgroundReconciler>> BackgroundReconciler::Start(
    const ReconcileFlags& flags, const ToolRegistry* tools, storage::Store* store, Clock* clock,
    std::function<void(const storage::JournalEntry&)> observer) {
  auto every = ParseDurationMs(flags.every, "--reconcile-every");
  if (!every.ok()) return every.status();
  if (*every <= 0) return Status::InvalidArgument("--reconcile-every: must be positive");
  auto since = ParseDurationMs(flags.since, "--reconcile-since");
  if (!since.ok()) return since.status();
  std::unique_ptr<BackgroundReconciler> r(new BackgroundReconciler());
  r->tools_ = tools;
  r->store_ = store;
  r->clock_ = clock;
  r->observer_ = std::move(observer);
  r->every_ms_ = *every;
  r->since_ms_ = *since;
  r->thread_ = std::thread([raw = r.get()] { raw->Loop(); });
  return r;
}

BackgroundReconciler::~BackgroundReconciler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int BackgroundReconciler::rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_;
}

void BackgroundReconciler::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    reconcile::DriftOptions options;
    options.clock = clock_;
    options.since_ms = clock_->NowMs() - since_ms_;
    options.observer = observer_;
    auto report = reconcile::FindDrift(store_, *tools_, options);
    if (!report.ok()) {
      observability::Log(observability::LogLevel::kWarn, "reconcile failed",
                         {{"error", report.status().ToString()}});
    } else {
      for (const reconcile::Drift& d : report->drifts) {
        if (!d.recorded_now) continue;
        observability::Log(observability::LogLevel::kWarn, "drift",
                           {{"kind", d.finding.kind},
                            {"tool", d.finding.tool},
                            {"key", d.finding.key},
                            {"saga_id", d.finding.saga_id}});
      }
      for (const std::string& e : report->errors) {
        observability::Log(observability::LogLevel::kWarn, "reconcile lookup", {{"error", e}});
      }
    }
    lock.lock();
    ++rounds_;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::milliseconds(every_ms_), [this] { return stop_; });
  }
}

}  // namespace idem::cli
