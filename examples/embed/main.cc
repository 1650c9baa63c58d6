// booking-service: a small cpp-httplib service of one's own that embeds the
// idem orchestrator (linked from an installed idem via find_package).
//
//   booking-service [--listen 127.0.0.1:8080] [--journal bookings.db]
//   booking-service admin --db bookings.db list|status SAGA|recover|...
//
// POST /book {"guest": "Ana", "nights": 2, "amount_cents": 24000}
//     with an Idempotency-Key header: books a stay as a saga (reserve a
//     room, charge the card; on a declined card the room is released). The
//     key is idem's intent key: the same key with the same body answers the
//     same saga and runs nothing again (200; 201 when the saga is new); the
//     same key with another body is 422.
// GET /sagas/{id}: the saga, its state and its steps.
// GET /metrics: idem's metrics (observability/metrics.h) for Prometheus:
//     this service's counters (steps, outcomes, duplicates absorbed, ...)
//     and the journal's gauges (sagas by state, ...).
//
// `admin` hands over to idem's command line (idem::cli::RunCli) with the
// same tools, on the service's journal.
//
// The providers here are in-memory FunctionTools that honour keys and
// answer status lookups; a card charge above EUR 1,000.00 is declined.

#include <csignal>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <httplib.h>

#include "cli/cli.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "observability/metrics.h"
#include <pthread.h>

namespace {

constexpr const char* kStaySpec = R"({
  "name": "stay",
  "description": "Reserve a room, then charge the card; release the room if the card is declined.",
  "steps": [
    {"id": "reserve_room", "tool": "rooms.reserve",
     "args": {"guest": "${input.guest}", "nights": "${input.nights}"},
     "compensate": {"tool": "rooms.release",
                    "args": {"room_id": "${steps.reserve_room.result.room_id}"}}},
    {"id": "charge_card", "tool": "card.charge",
     "args": {"guest": "${input.guest}", "amount_cents": "${input.amount_cents}"},
     "compensate": {"tool": "card.refund",
                    "args": {"charge_id": "${steps.charge_card.result.charge_id}"}}}
  ]
})";

constexpr int64_t kCardLimitCents = 100'000;

/// An in-memory provider that applies each key once and remembers the result.
class Provider {
 public:
  explicit Provider(std::string prefix) : prefix_(std::move(prefix)) {}

  /// Applies `make(id)` under `key` once; a repeat answers the first result.
  idem::ToolOutcome Apply(const std::string& key, const std::string& id_field,
                          const std::function<idem::Json(const std::string& id)>& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = applied_.find(key);
    if (it == applied_.end()) {
      const std::string id = prefix_ + std::to_string(++next_);
      it = applied_.emplace(key, make(id)).first;
    }
    return idem::ToolOutcome::Succeeded(it->second, it->second.value(id_field, ""));
  }

  idem::LookupOutcome Lookup(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    idem::LookupOutcome o;
    auto it = applied_.find(key);
    o.kind = it == applied_.end() ? idem::LookupKind::kNotApplied : idem::LookupKind::kApplied;
    if (it != applied_.end()) o.result = it->second;
    return o;
  }

 private:
  std::string prefix_;
  std::mutex mu_;
  std::map<std::string, idem::Json> applied_;
  int next_ = 0;
};

idem::ToolInfo Info(const std::string& name, idem::EffectClass effect, const std::string& what) {
  idem::ToolInfo info;
  info.name = name;
  info.effect = effect;
  info.honours_keys = true;
  info.description = what;
  return info;
}

idem::Status RegisterTools(idem::ToolRegistry& tools) {
  auto rooms = std::make_shared<Provider>("RM-");
  auto cards = std::make_shared<Provider>("CH-");
  auto lookup_rooms = [rooms](const std::string& key) { return rooms->Lookup(key); };
  auto lookup_cards = [cards](const std::string& key) { return cards->Lookup(key); };
  IDEM_RETURN_IF_ERROR(tools.Register(std::make_unique<idem::FunctionTool>(
      Info("rooms.reserve", idem::EffectClass::kWrite, "Reserve a room: {guest, nights}."),
      [rooms](const idem::ToolCall& call) {
        return rooms->Apply(call.key, "room_id", [&](const std::string& id) {
          return idem::Json{{"room_id", id},
                            {"guest", call.args.value("guest", "")},
                            {"nights", call.args.value("nights", 1)}};
        });
      },
      lookup_rooms)));
  IDEM_RETURN_IF_ERROR(tools.Register(std::make_unique<idem::FunctionTool>(
      Info("rooms.release", idem::EffectClass::kIdempotent, "Release a room: {room_id}."),
      [rooms](const idem::ToolCall& call) {
        return rooms->Apply(call.key, "room_id", [&](const std::string&) {
          return idem::Json{{"released", true}, {"room_id", call.args.value("room_id", "")}};
        });
      })));
  IDEM_RETURN_IF_ERROR(tools.Register(std::make_unique<idem::FunctionTool>(
      Info("card.charge", idem::EffectClass::kWrite,
           "Charge the guest's card: {guest, amount_cents}; declined above EUR 1,000.00."),
      [cards](const idem::ToolCall& call) {
        const idem::Json amount = call.args.value("amount_cents", idem::Json(0));
        if (!amount.is_number_integer() || amount.get<int64_t>() < 0) {
          return idem::ToolOutcome::Failed("amount_cents must be a non-negative integer", false);
        }
        if (amount.get<int64_t>() > kCardLimitCents) {
          return idem::ToolOutcome::Failed("card declined: over the limit", false);
        }
        return cards->Apply(call.key, "charge_id", [&](const std::string& id) {
          return idem::Json{{"charge_id", id}, {"amount_cents", amount}};
        });
      },
      lookup_cards)));
  IDEM_RETURN_IF_ERROR(tools.Register(std::make_unique<idem::FunctionTool>(
      Info("card.refund", idem::EffectClass::kIdempotent, "Refund a charge: {charge_id}."),
      [cards](const idem::ToolCall& call) {
        return cards->Apply(call.key, "charge_id", [&](const std::string&) {
          return idem::Json{{"refunded", true}, {"charge_id", call.args.value("charge_id", "")}};
        });
      })));
  return idem::Status::Ok();
}

idem::Json SagaJson(const idem::storage::SagaRecord& rec) {
  idem::Json steps = idem::Json::array();
  for (const auto& st : rec.steps) {
    steps.push_back({{"id", st.step_id},
                     {"tool", st.tool},
                     {"state", st.state},
                     {"result", st.result},
                     {"external_ref", st.external_ref}});
  }
  return {{"saga_id", rec.summary.saga_id},
          {"intent_key", rec.summary.intent_key},
          {"state", rec.summary.state},
          {"reason", rec.summary.reason},
          {"steps", steps}};
}

void Problem(httplib::Response& res, int status, const std::string& title,
             const std::string& detail) {
  res.status = status;
  res.set_content(idem::Json{{"title", title}, {"status", status}, {"detail", detail}}.dump(),
                  "application/problem+json");
}

int HttpStatusOf(const idem::Status& s) {
  switch (s.code()) {
    case idem::Code::kInvalidArgument:
      return 400;
    case idem::Code::kNotFound:
      return 404;
    case idem::Code::kConflict:
      return 422;  // the intent key is in use with another body
    case idem::Code::kUnavailable:
    case idem::Code::kAborted:
      return 503;
    default:
      return 500;
  }
}

int Serve(const std::string& listen, const std::string& journal) {
  idem::ToolRegistry tools;
  idem::Status registered = RegisterTools(tools);
  auto spec = idem::ParseSpecText(kStaySpec, tools, "stay");
  auto store = idem::storage::OpenStore(journal);
  if (!registered.ok() || !spec.ok() || !store.ok()) {
    std::cerr << "booking-service: "
              << (!registered.ok() ? registered
                  : !spec.ok()     ? spec.status()
                                   : store.status())
                     .ToString()
              << "\n";
    return 1;
  }
  // The engine reports every journal entry (and each duplicate it absorbs)
  // to the metrics; /metrics below renders them.
  idem::observability::Metrics metrics;
  idem::EngineOptions options;
  idem::observability::ReportTo(&metrics, store->get(), &options);
  idem::Engine engine(store->get(), &tools, options);
  // Finish what a previous run left unfinished.
  auto recovered = engine.Recover();
  if (!recovered.ok()) std::cerr << "booking-service: " << recovered.status().ToString() << "\n";

  // One saga drive at a time keeps the example simple (idem drives each saga
  // from one thread at a time).
  std::mutex drive_mu;
  httplib::Server server;
  server.Post("/book", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string key = req.get_header_value("Idempotency-Key");
    if (key.empty()) {
      Problem(res, 400, "Idempotency-Key is missing", "POST /book needs an Idempotency-Key");
      return;
    }
    auto input = idem::ParseJson(req.body, "body");
    if (!input.ok() || !input->is_object()) {
      Problem(res, 400, "The body is not a JSON object",
              input.ok() ? "expected {\"guest\": ..., ...}" : input.status().message());
      return;
    }
    std::lock_guard<std::mutex> lock(drive_mu);
    auto submitted = engine.Submit(*spec, *input, key);
    if (!submitted.ok()) {
      Problem(res, HttpStatusOf(submitted.status()), "Not booked", submitted.status().message());
      return;
    }
    auto rec = engine.Run(submitted->saga_id);  // a finished saga runs nothing
    if (!rec.ok()) {
      Problem(res, HttpStatusOf(rec.status()), "The saga could not be driven",
              rec.status().message());
      return;
    }
    idem::Json body = SagaJson(*rec);
    body["created"] = submitted->created;
    res.status = submitted->created ? 201 : 200;
    res.set_content(body.dump(), "application/json");
  });
  server.Get(R"(/sagas/([^/]+))", [&](const httplib::Request& req, httplib::Response& res) {
    auto rec = (*store)->LoadSaga(req.matches[1].str());
    if (!rec.ok()) {
      Problem(res, HttpStatusOf(rec.status()), "No such saga", rec.status().message());
      return;
    }
    res.set_content(SagaJson(*rec).dump(), "application/json");
  });

  server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.Render(store->get()), "text/plain; version=0.0.4; charset=utf-8");
  });

  const auto colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  const int port = colon == std::string::npos ? 8080 : std::stoi(listen.substr(colon + 1));
  const int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    std::cerr << "booking-service: cannot listen on " << listen << "\n";
    return 1;
  }
  // SIGINT/SIGTERM stop the server; in-flight requests finish.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    server.stop();
  });
  std::cout << "listening on http://" << host << ":" << bound << std::endl;
  server.listen_after_bind();
  waiter.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "admin") {
    idem::cli::FrontendConfig config;
    config.program = "booking-service admin";
    config.description = "booking-service admin: idem's command line on the service's journal";
    config.register_tools = [](idem::ToolRegistry& tools, const idem::cli::Context&) {
      return RegisterTools(tools);
    };
    return idem::cli::RunCli(argc - 1, argv + 1, config);
  }
  CLI::App app("booking-service: book stays as idem sagas over HTTP");
  std::string listen = "127.0.0.1:8080";
  std::string journal = "bookings.db";
  app.add_option("--listen", listen, "HOST:PORT (port 0: any free port)")->capture_default_str();
  app.add_option("--journal", journal, "idem's journal: a SQLite file or postgresql://...")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return Serve(listen, journal);
}
