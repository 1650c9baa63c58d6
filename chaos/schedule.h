#pragma once
// The sweep's plan: a pure function of a seed. Which sagas run, in which
// scenario, with which faults, which commands an operator types for them,
// when each process is killed (as a fraction of that kind of process's
// typical duration, drawn uniformly in [0, 1.2]) and what happens while a
// saga runs (a cancel, a pause, a worker killed or stopped past its lease,
// PostgreSQL restarted). Timing-dependent outcomes may differ between two
// runs of one seed; the plan may not: Digest() names it.
//
//   chaos::Settings s;  s.seed = 42;  s.sagas = 25;  s.postgres = false;
//   chaos::Plan plan = chaos::MakePlan(s);
//   std::cout << plan.Digest();   // the same for every run of seed 42
//
// Scenarios: each saga kind is one row of Scenarios() (its spec and a
// function that draws its commands); docs/reliability.md says how to add
// one. The generator is splitmix64 with its own uniform draws (no <random>
// distributions, whose results differ between standard libraries).
//
// Thread safety: plain values; MakePlan may be called from any thread.

#include <cstdint>
#include <string>
#include <vector>

namespace idem::chaos {

/// splitmix64: small, fast, the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  /// Uniform in [0, 1).
  double Uniform();
  /// Uniform in [lo, hi] (integers).
  int Between(int lo, int hi);
  /// True with probability p.
  bool Chance(double p) { return Uniform() < p; }

 private:
  uint64_t state_;
};

/// Something that happens while a command runs, at `at` × the command's
/// typical duration.
struct Event {
  /// "cancel", "pause", "kill_worker", "stop_worker", "pg_restart";
  /// "kill_server" (SIGKILL an `idem serve`, restarted), "kill_provider"
  /// (SIGKILL the HTTP providers, restarted on the same ledger).
  std::string what;
  double at = 0;
  double kill_at = -1;  ///< for cancel/pause: when that process is killed (<0: not)
};

/// One command an operator (or an agent) runs for a saga.
struct Command {
  /// "run", "submit" (workers drive it), "recover", "approve", "reject",
  /// "resume"; an agent loop through the CLI: "open_begin", "open_call",
  /// "open_commit", "open_rollback"; over the REST API of `idem serve`:
  /// "http_submit" (then waits for the saga to settle), "http_approve",
  /// "http_reject" (kill_at kills a server meanwhile).
  std::string verb;
  std::vector<std::string> faults;  ///< --fault TOOL=MODE[@N] of this process
  int latency_ms = 0;               ///< --latency-ms
  double kill_at = -1;              ///< SIGKILL at this × typical duration; <0: none
  /// kill_at is a fraction of the measured window in which the parallel
  /// branches (flight, hotel, car) are in flight, not of the whole command.
  bool kill_in_branches = false;
  std::string call_id;  ///< open_call: the model's call id (repeated: the model repeats itself)
  std::string tool;     ///< open_call: the tool
  std::vector<Event> during;
};

/// One saga and its commands, in order.
struct SagaPlan {
  int index = 0;
  std::string scenario;    ///< a row of Scenarios()
  std::string intent_key;  ///< "chaos-<seed>-<index>"
  std::vector<Command> commands;
};

struct Settings {
  uint64_t seed = 1;
  int sagas = 25;
  bool postgres = false;  ///< workers, lease stops and server restarts too
  int pg_restarts = 2;    ///< PostgreSQL only: exactly this many restarts
};

/// The whole plan for one store.
struct Plan {
  Settings settings;
  std::vector<SagaPlan> sagas;
  /// Kill fractions for the end phase (the person's resolves, approvals and
  /// resumes), used in turn; how many are used depends on what is parked.
  std::vector<double> person_kills;
  /// The plan as text, one line per command (what Digest() hashes).
  std::string Text() const;
  /// "sha256:<hex>" of Text().
  std::string Digest() const;
};

/// One saga kind the sweep drives.
struct Scenario {
  const char* name;
  const char* spec;  ///< the spec file, relative to the source tree ("" for open sagas)
  /// Draws the saga's commands (after the scenario was picked); nullptr: a
  /// reserved kind that is never drawn.
  void (*draw)(Rng& rng, const Settings& settings, SagaPlan* saga);
};

/// Every scenario, in a fixed order (a saga's scenario is drawn from those
/// with a draw function).
const std::vector<Scenario>& Scenarios();

/// The scenario named `name`, or nullptr.
const Scenario* FindScenario(const std::string& name);

/// The plan for `settings` (pure: the same settings give the same plan).
Plan MakePlan(const Settings& settings);

/// Draws 0..2 provider faults for one process (the travel providers' modes:
/// lose_request, lose_response, delay, fail, reject, reprice).
std::vector<std::string> DrawFaults(Rng& rng);

/// A kill fraction: with probability `p` uniform in [0, 1.2], else -1.
double DrawKill(Rng& rng, double p);

}  // namespace idem::chaos
