#include "chaos/report.h"

#include <cstdio>
#include <set>
#include <sstream>

namespace idem::chaos {

namespace {

std::string Pad(const std::string& s, size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

std::string Row(const std::string& name, const std::vector<std::string>& cells) {
  std::string line = "| " + Pad(name, 24);
  for (const auto& c : cells) line += " | " + Pad(c, 10);
  return line + " |\n";
}

}  // namespace

std::string FormatTable(const std::vector<StoreReport>& stores) {
  std::vector<std::string> header;
  std::vector<std::string> rule;
  for (const auto& s : stores) {
    header.push_back(s.store);
    rule.push_back(std::string(10, '-'));
  }
  std::string out = Row("check", header);
  out += "|" + std::string(26, '-');
  for (size_t i = 0; i < stores.size(); ++i) out += "|" + std::string(12, '-');
  out += "|\n";
  for (const auto& name : CheckNames()) {
    std::vector<std::string> cells;
    for (const auto& s : stores) cells.push_back(std::to_string(s.check.Count(name)));
    out += Row(name, cells);
  }
  auto figure = [&](const std::string& label, auto get) {
    std::vector<std::string> cells;
    for (const auto& s : stores) cells.push_back(get(s));
    out += Row(label, cells);
  };
  figure("(sagas in the journal)",
         [](const StoreReport& s) { return std::to_string(s.check.sagas); });
  figure("(ledger effects)", [](const StoreReport& s) { return std::to_string(s.check.effects); });
  figure("(acknowledged sagas)",
         [](const StoreReport& s) { return std::to_string(s.check.acked); });
  if (!stores.empty() && stores.front().ran) {
    figure("(SIGKILLs)", [](const StoreReport& s) { return std::to_string(s.stats.TotalKills()); });
    figure("(PostgreSQL restarts)",
           [](const StoreReport& s) { return std::to_string(s.stats.pg_restarts); });
    auto kills = [](const StoreReport& s, const char* kind) {
      auto it = s.stats.kills.find(kind);
      return std::to_string(it == s.stats.kills.end() ? 0 : it->second);
    };
    figure("(servers killed)", [&](const StoreReport& s) { return kills(s, "serve"); });
    figure("(providers killed)", [&](const StoreReport& s) { return kills(s, "provider"); });
    figure("(kills in branches)",
           [](const StoreReport& s) { return std::to_string(s.stats.branch_kills); });
    figure("(late-write audit rows)",
           [](const StoreReport& s) { return std::to_string(s.check.journal_writes); });
  }
  return out;
}

std::string FormatFindings(const std::vector<StoreReport>& stores, size_t limit) {
  std::ostringstream out;
  for (const auto& s : stores) {
    size_t n = 0;
    for (const auto& f : s.check.findings) {
      if (n++ == limit) {
        out << s.store << ": ... " << (s.check.findings.size() - limit) << " more\n";
        break;
      }
      out << s.store << ": " << f.check << ": " << (f.saga_id.empty() ? "" : f.saga_id + ": ")
          << f.detail << "\n";
    }
  }
  return out.str();
}

std::string FormatFigures(const std::vector<StoreReport>& stores) {
  std::ostringstream out;
  for (const auto& s : stores) {
    out << s.store << ":";
    if (!s.digest.empty()) out << " plan " << s.digest;
    out << "\n  sagas by state:";
    for (const auto& [state, n] : s.check.states) out << " " << state << "=" << n;
    out << "\n";
    if (!s.ran) continue;
    out << "  SIGKILLs by kind:";
    for (const auto& [kind, n] : s.stats.kills) out << " " << kind << "=" << n;
    out << "\n  processes by kind:";
    for (const auto& [kind, n] : s.stats.commands) out << " " << kind << "=" << n;
    out << "\n  workers that ended by themselves:";
    for (const auto& [how, n] : s.stats.worker_exits) out << " " << how << "=" << n;
    out << "\n  final HTTP answers by kind:";
    for (const auto& [what, n] : s.stats.http_answers) out << " " << what << "=" << n;
    out << "\n  typical ms by kind:";
    for (const auto& [kind, ms] : s.stats.typical_ms) out << " " << kind << "=" << ms;
    out << "\n  PostgreSQL restarts=" << s.stats.pg_restarts
        << " worker stops past the lease=" << s.stats.worker_stops
        << " person decisions=" << s.stats.person_decisions
        << " settle rounds=" << s.stats.settle_rounds << " elapsed " << (s.stats.elapsed_ms / 1000)
        << " s\n";
  }
  return out.str();
}

}  // namespace idem::chaos
