#include "chaos/schedule.h"

#include <cstdio>
#include <sstream>

#include "common/json_util.h"

namespace idem::chaos {

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

int Rng::Between(int lo, int hi) {
  if (hi <= lo) return lo;
  return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
}

double DrawKill(Rng& rng, double p) {
  if (!rng.Chance(p)) return -1;
  return 1.2 * rng.Uniform();
}

std::vector<std::string> DrawFaults(Rng& rng) {
  static const char* kTools[] = {"flights.reserve", "hotels.book",    "cars.rent",
                                 "payments.charge", "flights.cancel", "hotels.cancel",
                                 "cars.return",     "payments.refund"};
  static const char* kModes[] = {"lose_request", "lose_response", "delay",
                                 "fail",         "reject",        "reprice"};
  std::vector<std::string> out;
  int n = rng.Chance(0.45) ? rng.Between(1, 2) : 0;
  for (int i = 0; i < n; ++i) {
    std::string tool = kTools[rng.Between(0, 7)];
    std::string mode = kModes[rng.Between(0, 5)];
    if (mode == "reprice" && tool != "flights.reserve" && tool != "payments.charge") {
      mode = "fail";  // reprice exists only for the tools with a preview
    }
    if (mode == "delay") mode = "delay(" + std::to_string(rng.Between(5, 120)) + ")";
    // Mostly one call (@1 or @2); sometimes every call of the tool.
    std::string nth = rng.Chance(0.8) ? "@" + std::to_string(rng.Between(1, 2)) : "";
    out.push_back(tool + "=" + mode + nth);
  }
  return out;
}

namespace {

// A run (or, on PostgreSQL, sometimes a submit that the workers drive) with
// its faults, its kill and what happens meanwhile. With `parallel` (the
// spec books flight, hotel and car at once) a share of the kills lands in
// the window in which those branches are in flight: the providers are slowed
// so that the window is wide enough to hit.
Command DrawStart(Rng& rng, const Settings& s, bool parallel) {
  Command c;
  c.verb = (s.postgres && rng.Chance(0.35)) ? "submit" : "run";
  c.faults = DrawFaults(rng);
  c.latency_ms = rng.Chance(0.5) ? rng.Between(1, 25) : 0;
  c.kill_at = DrawKill(rng, 0.85);
  if (parallel && c.verb == "run" && c.kill_at >= 0 && rng.Chance(0.4)) {
    c.kill_in_branches = true;
    c.latency_ms = rng.Between(40, 100);
  }
  if (rng.Chance(0.12)) c.during.push_back({"cancel", 1.2 * rng.Uniform(), DrawKill(rng, 0.5)});
  if (rng.Chance(0.12)) c.during.push_back({"pause", 1.2 * rng.Uniform(), DrawKill(rng, 0.5)});
  if (s.postgres && rng.Chance(0.35)) c.during.push_back({"kill_worker", 1.2 * rng.Uniform()});
  if (s.postgres && rng.Chance(0.06)) c.during.push_back({"stop_worker", 1.2 * rng.Uniform()});
  return c;
}

Command Simple(Rng& rng, const std::string& verb, double kill_p, bool faults) {
  Command c;
  c.verb = verb;
  if (faults) c.faults = DrawFaults(rng);
  c.kill_at = DrawKill(rng, kill_p);
  return c;
}

// The start, and a resume after it when a pause is planned meanwhile.
void DrawStartAndResume(Rng& rng, const Settings& s, SagaPlan* saga, bool parallel) {
  saga->commands.push_back(DrawStart(rng, s, parallel));
  bool paused = false;
  for (const auto& e : saga->commands.back().during) paused = paused || e.what == "pause";
  if (paused) saga->commands.push_back(Simple(rng, "resume", 0.5, false));
}

// trip.json: flight, hotel, car, then a previewed charge that waits for a
// person's approval; the person approves (or rejects) it, with faults of its
// own (the commit runs in the approving process).
void DrawTripApproval(Rng& rng, const Settings& s, SagaPlan* saga) {
  DrawStartAndResume(rng, s, saga, /*parallel=*/true);
  saga->commands.push_back(Simple(rng, "recover", 0.7, true));
  saga->commands.push_back(Simple(rng, rng.Chance(0.75) ? "approve" : "reject", 0.7, true));
  saga->commands.push_back(Simple(rng, "recover", 0.6, true));
}

// The same trip in one phase (no approval): run, then recover.
void DrawTripDirect(Rng& rng, const Settings& s, SagaPlan* saga) {
  DrawStartAndResume(rng, s, saga, /*parallel=*/false);
  saga->commands.push_back(Simple(rng, "recover", 0.7, true));
}

// An agent loop on an open saga (`open begin|call|commit|rollback`, one
// process per verb): two to four bookings, the model sometimes repeating a
// call id it used (a retry after a kill repeats it too), each call with
// faults and a kill; then commit or, after kills, rollback.
void DrawOpenAgent(Rng& rng, const Settings&, SagaPlan* saga) {
  static const char* kTools[] = {"flights.reserve", "hotels.book", "cars.rent"};
  saga->commands.push_back(Simple(rng, "open_begin", 0.5, false));
  const int calls = rng.Between(2, 4);
  for (int i = 1; i <= calls; ++i) {
    Command c = Simple(rng, "open_call", 0.7, true);
    c.call_id = "call-" + std::to_string(i);
    c.tool = kTools[rng.Between(0, 2)];
    c.latency_ms = rng.Chance(0.5) ? rng.Between(1, 25) : 0;
    saga->commands.push_back(c);
    if (rng.Chance(0.3)) {  // the model repeats itself: the same call id
      Command again = c;
      again.faults = DrawFaults(rng);
      again.kill_at = DrawKill(rng, 0.5);
      saga->commands.push_back(again);
    }
  }
  saga->commands.push_back(
      Simple(rng, rng.Chance(0.6) ? "open_commit" : "open_rollback", 0.6, true));
  saga->commands.push_back(Simple(rng, "recover", 0.5, true));
}

// The trip through `idem serve` (two on PostgreSQL, on one database) and the
// providers as an HTTP process: the agent submits with an Idempotency-Key
// and retries with it after a kill or a lost answer; servers and the
// provider process are killed meanwhile; a person approves or rejects over
// the API. The submit's faults are the provider process's (it is restarted
// with them).
void DrawTripServer(Rng& rng, const Settings& s, SagaPlan* saga) {
  Command submit;
  submit.verb = "http_submit";
  submit.faults = DrawFaults(rng);
  submit.latency_ms = rng.Chance(0.5) ? rng.Between(1, 25) : 0;
  submit.kill_at = DrawKill(rng, 0.7);
  if (rng.Chance(0.35)) submit.during.push_back({"kill_provider", 1.2 * rng.Uniform()});
  if (rng.Chance(0.25)) submit.during.push_back({"kill_server", 1.2 * rng.Uniform()});
  if (rng.Chance(0.08)) submit.during.push_back({"cancel", 1.2 * rng.Uniform(), -1});
  if (s.postgres && rng.Chance(0.2)) submit.during.push_back({"kill_worker", 1.2 * rng.Uniform()});
  saga->commands.push_back(submit);
  Command decide = Simple(rng, rng.Chance(0.75) ? "http_approve" : "http_reject", 0.6, false);
  if (rng.Chance(0.3)) decide.during.push_back({"kill_provider", 1.2 * rng.Uniform()});
  saga->commands.push_back(decide);
}

// trip_async.json: flight, hotel, car and an airport transfer from the slow
// provider (transfers.book takes the call, confirms it the sweep's
// --confirm-delay-ms later), then the payment. Kills land while the branches
// are in flight and while the transfer is pending (run ends, the saga waits
// in awaiting_completion, the recovers' status checks finish it); the
// transfer's own faults: a lost request or answer (resolved by its status),
// or a job the provider later declines (the saga rolls back).
void DrawTripAsync(Rng& rng, const Settings& s, SagaPlan* saga) {
  DrawStartAndResume(rng, s, saga, /*parallel=*/true);
  Command& start = saga->commands.front();
  if (rng.Chance(0.4)) {
    static const char* kModes[] = {"lose_request@1", "lose_response@1", "decline", "fail@1"};
    start.faults.push_back(std::string("transfers.book=") + kModes[rng.Between(0, 3)]);
  }
  saga->commands.push_back(Simple(rng, "recover", 0.7, true));
  saga->commands.push_back(Simple(rng, "recover", 0.5, true));
}

}  // namespace

const std::vector<Scenario>& Scenarios() {
  // clang-format off
  static const std::vector<Scenario> kScenarios = {
    //  name             spec (source tree)                     draw
    {"trip_approval", "examples/travel_booking/trip.json",   &DrawTripApproval},
    {"trip_direct",   "chaos/specs/trip_direct.json",        &DrawTripDirect},
    {"open_agent",    "",                                    &DrawOpenAgent},
    {"trip_server",   "examples/travel_booking/trip.json",   &DrawTripServer},
    {"trip_async",    "examples/travel_booking/trip_async.json", &DrawTripAsync},
  };
  // clang-format on
  return kScenarios;
}

const Scenario* FindScenario(const std::string& name) {
  for (const auto& s : Scenarios()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

Plan MakePlan(const Settings& settings) {
  Plan plan;
  plan.settings = settings;
  Rng rng(settings.seed ^ (settings.postgres ? 0x5047ULL : 0x53514cULL));
  std::vector<const Scenario*> drawn;
  for (const auto& sc : Scenarios()) {
    if (sc.draw != nullptr) drawn.push_back(&sc);
  }
  for (int i = 0; i < settings.sagas; ++i) {
    SagaPlan saga;
    saga.index = i;
    const Scenario& sc = *drawn[rng.Between(0, static_cast<int>(drawn.size()) - 1)];
    saga.scenario = sc.name;
    saga.intent_key = "chaos-" + std::to_string(settings.seed) + "-" +
                      (settings.postgres ? "pg-" : "sq-") + std::to_string(i);
    sc.draw(rng, settings, &saga);
    plan.sagas.push_back(std::move(saga));
  }
  // Exactly pg_restarts restarts, each during the first command of a saga
  // drawn uniformly (a saga may get more than one).
  if (settings.postgres && settings.sagas > 0) {
    for (int r = 0; r < settings.pg_restarts; ++r) {
      auto& c = plan.sagas[rng.Between(0, settings.sagas - 1)].commands.front();
      c.during.push_back({"pg_restart", 1.2 * rng.Uniform()});
    }
  }
  for (int i = 0; i < 64; ++i) plan.person_kills.push_back(DrawKill(rng, 0.5));
  return plan;
}

std::string Plan::Text() const {
  std::ostringstream out;
  char buf[64];
  auto frac = [&](double v) {
    std::snprintf(buf, sizeof buf, "%.6f", v);
    return std::string(buf);
  };
  out << "seed " << settings.seed << " store " << (settings.postgres ? "postgres" : "sqlite")
      << " sagas " << settings.sagas << " pg_restarts " << settings.pg_restarts << "\n";
  for (const auto& s : sagas) {
    for (const auto& c : s.commands) {
      out << s.index << " " << s.scenario << " " << s.intent_key << " " << c.verb
          << " kill=" << frac(c.kill_at) << (c.kill_in_branches ? "/branches" : "")
          << " latency=" << c.latency_ms;
      if (!c.call_id.empty()) out << " call=" << c.call_id << ":" << c.tool;
      for (const auto& f : c.faults) out << " fault=" << f;
      for (const auto& e : c.during) {
        out << " during=" << e.what << "@" << frac(e.at) << "/kill=" << frac(e.kill_at);
      }
      out << "\n";
    }
  }
  out << "person";
  for (double k : person_kills) out << " " << frac(k);
  out << "\n";
  return out.str();
}

std::string Plan::Digest() const { return "sha256:" + Sha256Hex(Text()); }

}  // namespace idem::chaos
