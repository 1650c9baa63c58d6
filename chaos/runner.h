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
// The HTTP path (chaos/http_path.cc): the travel providers run as one HTTP
// process (travel-providers, on the same ledger as the in-process ones, its
// keys in a file of the work directory) and `idem serve` with the HTTP tools
// (one server on its own SQLite journal, which serve holds; two servers on
// the PostgreSQL database). The runner is the agent: it submits over
// loopback with an Idempotency-Key and retries with that key after a kill or
// a lost answer, as clients/typescript does; every 2xx answer is
// acknowledged. Servers and the provider process are SIGKILLed and
// restarted (the provider on its ledger and key store). Sagas submitted over
// the API are decided (approve, resolve, resume) over the API too.
//
// The late-write audit (chaos/audit.cc, PostgreSQL): a trigger on the
// journal records, per entry, the writing worker (its libpq
// application_name, set to its lease owner name) and the saga's lease owner
// at that moment; the checker's late_writes row reads it.
//
// Thread safety: one thread; a Runner is used once.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "chaos/process.h"
#include "chaos/schedule.h"
#include "common/status.h"

namespace idem::chaos {

struct RunnerConfig {
  std::string travel_booking;    ///< the binary
  std::string idem;              ///< `idem` (serve); "": no HTTP path
  std::string travel_providers;  ///< the providers' HTTP server
  std::string source_dir;        ///< the source tree (specs, input, scripts)
  std::string work_dir;          ///< created; the journal, ledger, logs
  bool verbose = false;          ///< one line per command on stdout
  int lease_ms = 1500;           ///< the workers' lease (PostgreSQL)
  int settle_timeout_s = 180;    ///< the end phase's bound (idem-chaos: 2 s per saga, at least 180)
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
  int branch_kills = 0;
  std::map<std::string, int>
      http_answers;  ///< "KIND STATUS" of the agent's and person's requests  ///< kills of a run
                     ///< timed into its parallel branches' window
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
  /// Every journal the sweep wrote (the CLI's, and on SQLite the servers').
  std::vector<std::string> locators() const;
  /// The journal audit (PostgreSQL; "" on SQLite), written by Execute.
  const std::string& audit_file() const { return audit_; }
  const std::string& ledger() const { return ledger_; }
  const std::string& acked_file() const { return acked_; }
  const RunStats& stats() const { return stats_; }

  /// Stops the workers and the PostgreSQL server (also done by the
  /// destructor); call after the checker has read the store.
  void Shutdown();

 private:
  struct Aux {  // a process started during a command (cancel, pause, restart)
    std::string kind;
    Child child;
    int64_t kill_ms = -1;  // absolute; -1: never
  };
  struct Server {
    Child child;
    int port = 0;
    int64_t start_after_ms = 0;  // restart due (0: running)
  };
  struct HttpAnswer {
    int status = 0;  // 0: no answer (refused, reset, timed out)
    std::string body;
  };

  Status SetUp();
  std::vector<std::string> Base() const;
  void RunCommand(const SagaPlan& saga, const Command& cmd);
  void RunOpenCommand(const SagaPlan& saga, const Command& cmd, std::vector<std::string> argv);
  // The HTTP path (chaos/http_path.cc).
  Status SetUpHttp();
  void StartServer(int i);
  void KillServer(int i);
  Status StartProvider(const std::vector<std::string>& faults, int latency_ms);
  void KillProvider();
  void MaintainHttp();
  void RunHttpCommand(const SagaPlan& saga, const Command& cmd);
  // The agent's keyed submit with its retries; the saga id of a 2xx
  // (acknowledged at once), "" otherwise; *status the last answer's.
  std::string SubmitOverApi(const std::string& key, const std::string& text, int* status);
  // Submits that got 409 (in flight) to the end, once more after the key
  // layer's lock timeout.
  void RetryGivenUp();
  // Sends one request to server `i` ("" body: GET).
  HttpAnswer Request(int i, const std::string& method, const std::string& path,
                     const std::string& body, const std::string& idempotency_key);
  // Runs `fn` on a thread while the plan's events and kills fire; answers
  // its duration.
  int64_t WhileRunning(const std::string& kind, double kill_at, const std::vector<Event>& during,
                       const std::string& saga_id, const std::function<int()>& fn);
  // POSTs `body` to `path` (round the servers) until an answer is final or
  // 12 attempts (a person is patient); answers the last status (0: none).
  int Retrying(const std::string& path, const std::string& body);
  bool ApiSaga(const std::string& saga_id) const;
  void ApiDecision(const std::vector<std::string>& decision);
  // The audit (chaos/audit.cc).
  Status InstallAudit();
  void DumpAudit();
  // Starts `argv` as `kind`, kills it at kill_at × typical(kind) (when
  // measured), fires `during` meanwhile; answers how it ended and its stdout.
  Exit Supervise(const std::string& kind, const std::vector<std::string>& argv, double kill_at,
                 const std::vector<Event>& during, const std::string& saga_id, std::string* out,
                 int64_t kill_offset_ms = -1);
  // Records when the first parallel branch of `saga_id` reached its provider
  // (the ledger's calls), from `wall0`, as the "branches" typical.
  void MeasureBranches(const std::string& saga_id, int64_t wall0);
  void Fire(const Event& e, const std::string& saga_id, std::vector<Aux>* aux);
  void Maintain();
  void NoteAck(const std::string& out, const std::string& intent_key);
  std::string SagaIdFor(const std::string& intent_key, const std::string& locator = "");
  std::string TokenFor(const std::string& saga_id, const std::string& locator = "");
  void StartWorker(int i);
  void KillWorker(int i);
  void StopWorker(int i);
  void RestartPostgres(std::vector<Aux>* aux);
  Status Settle();
  bool RecoverUntilQuiet(int64_t deadline_ms);
  int PersonPass();
  int PersonPass(const std::string& locator);
  double NextPersonKill();
  int64_t Typical(const std::string& kind) const;
  std::string LogPath(const std::string& name) const;

  RunnerConfig config_;
  Plan plan_;
  RunStats stats_;
  std::string locator_, ledger_, keys_, acked_, pg_dir_, input_;
  std::string http_locator_, audit_, tools_file_, auth_file_, token_, person_token_;
  std::vector<Server> servers_;
  Child provider_;
  std::vector<std::string> provider_faults_;
  int provider_latency_ms_ = -1;
  int provider_port_ = 0;
  int64_t provider_start_after_ms_ = 0;  // restart due (0: running or never started)
  std::set<std::string> api_sagas_;      // saga ids submitted over the API
  std::string current_journal_key_;      // of the http_submit under way
  struct GivenUp {
    std::string key, body;
    int64_t at_ms = 0;
  };
  std::vector<GivenUp> given_up_;
  std::map<std::string, std::string> saga_ids_;               // intent key -> saga id
  std::map<std::string, std::pair<int64_t, int>> durations_;  // kind -> (sum ms, n)
  std::vector<Child> workers_;
  std::vector<int64_t> stopped_until_;  // per worker: SIGCONT due (0: running)
  int worker_spawns_ = 0;
  size_t person_kill_next_ = 0;
  bool shut_down_ = false;
};

}  // namespace idem::chaos
