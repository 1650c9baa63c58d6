#pragma once
// The sweep's runner: carries out a Plan (chaos/schedule.h) against one
// store with the travel example's binaries, kills what the plan says to
// kill, then drives everything to an end the way an operator would
// (recover until nothing moves; a person who approves what waits, resumes
// what is paused and resolves what is parked from the ledger's truth, with
// kills of their own; recover again).
//
//   chaos::RunnerConfig cfg;  cfg.travel_booking = ".../travel-booking"; ...
//   chaos::Runner runner(cfg, plan);
//   Status s = runner.Execute();      // the plan, then the end phase
//   chaos::RunStats st = runner.stats();
//
// Kill times: a command's kill fraction is multiplied by the typical
// duration of its verb, the mean of that verb's runs that ended by
// themselves; the first run of each verb is not killed (it measures).
// On PostgreSQL the runner starts its own throwaway server
// (scripts/pg-test-server.sh in a folder of the work directory, a private
// port), keeps two `worker` processes running (restarted when killed), and
// restarts the server or stops a worker past its lease when the plan says.
//
// Every saga id a `run` or `submit` printed is appended to the acked file
// (checker.h) before anything else happens, so a kill cannot hide it.
//
// Thread safety: one thread; a Runner is used once.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chaos/process.h"
#include "chaos/schedule.h"
#include "common/status.h"

namespace idem::chaos {

struct RunnerConfig {
  std::string travel_booking;  ///< the binary
  std::string source_dir;      ///< the source tree (specs, input, scripts)
  std::string work_dir;        ///< created; the journal, ledger, logs
  bool verbose = false;        ///< one line per command on stdout
  int lease_ms = 1500;         ///< the workers' lease (PostgreSQL)
  int settle_timeout_s = 180;  ///< the end phase's bound
};

/// What happened, for the report.
struct RunStats {
  std::map<std::string, int> kills;     ///< SIGKILLs that hit a live process, per kind
  std::map<std::string, int> commands;  ///< processes started, per kind
  std::map<std::string, int> pg_restarts_by_outcome;
  std::map<std::string, int> worker_exits;  ///< workers that ended by themselves, by how
  int pg_restarts = 0;
  int worker_stops = 0;
  int person_decisions = 0;
  int settle_rounds = 0;
  int64_t elapsed_ms = 0;
  std::map<std::string, int64_t> typical_ms;  ///< per verb, at the end
  int TotalKills() const;
};

class Runner {
 public:
  Runner(RunnerConfig config, Plan plan);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// Sets up the store (and on PostgreSQL its server and workers), carries
  /// out the plan and the end phase. An error means the sweep itself could
  /// not go on (a binary missing, the server not starting): findings about
  /// idem are the checker's.
  Status Execute();

  /// The store's locator and the ledger's path (valid after Execute began).
  const std::string& locator() const { return locator_; }
  const std::string& ledger() const { return ledger_; }
  const std::string& acked_file() const { return acked_; }
  const RunStats& stats() const { return stats_; }

  /// Stops the workers and the PostgreSQL server (also done by the
  /// destructor); call after the checker has read the store.
  void Shutdown();

 private:
  struct Aux;  // a process started during a command (cancel, pause, restart)

  Status SetUp();
  std::vector<std::string> Base() const;
  void RunCommand(const SagaPlan& saga, const Command& cmd);
  // Starts `argv` as `kind`, kills it at kill_at × typical(kind) (when
  // measured), fires `during` meanwhile; answers how it ended and its stdout.
  Exit Supervise(const std::string& kind, const std::vector<std::string>& argv, double kill_at,
                 const std::vector<Event>& during, const std::string& saga_id, std::string* out);
  void Fire(const Event& e, const std::string& saga_id, std::vector<Aux>* aux);
  void Maintain();
  void NoteAck(const std::string& out, const std::string& intent_key);
  std::string SagaIdFor(const std::string& intent_key);
  std::string TokenFor(const std::string& saga_id);
  void StartWorker(int i);
  void KillWorker(int i);
  void StopWorker(int i);
  void RestartPostgres(std::vector<Aux>* aux);
  Status Settle();
  bool RecoverUntilQuiet(int64_t deadline_ms);
  int PersonPass();
  double NextPersonKill();
  int64_t Typical(const std::string& kind) const;
  std::string LogPath(const std::string& name) const;

  RunnerConfig config_;
  Plan plan_;
  RunStats stats_;
  std::string locator_, ledger_, keys_, acked_, pg_dir_, input_;
  std::map<std::string, std::string> saga_ids_;               // intent key -> saga id
  std::map<std::string, std::pair<int64_t, int>> durations_;  // kind -> (sum ms, n)
  std::vector<Child> workers_;
  std::vector<int64_t> stopped_until_;  // per worker: SIGCONT due (0: running)
  int worker_spawns_ = 0;
  size_t person_kill_next_ = 0;
  bool shut_down_ = false;
};

}  // namespace idem::chaos
