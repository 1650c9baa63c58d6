#include "common/failpoint.h"

#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace idem::failpoint {
namespace {

enum class Action { kOff, kKill, kErr, kSleep };

struct Armed {
  Action action = Action::kOff;
  int nth = 0;  // 0: every hit
  int sleep_ms = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, Armed> armed;  // GUARDED_BY(mu)
  std::map<std::string, int> hits;     // GUARDED_BY(mu)
};

Registry& Reg() {
  static Registry* r = new Registry();
  return *r;
}

bool IsKnown(const std::string& name) {
  for (const Site& s : KnownFailpoints()) {
    if (name == s.name) return true;
  }
  return false;
}

Result<Armed> ParseAction(const std::string& entry, const std::string& text) {
  Armed a;
  std::string action = text;
  auto at = text.find('@');
  if (at != std::string::npos) {
    action = text.substr(0, at);
    std::string n = text.substr(at + 1);
    char* end = nullptr;
    long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 1 || v > 1'000'000) {
      return Status::InvalidArgument("IDEM_FAILPOINT entry \"" + entry +
                                     "\": @N must be 1..1000000");
    }
    a.nth = static_cast<int>(v);
  }
  if (action == "kill") {
    a.action = Action::kKill;
  } else if (action == "err") {
    a.action = Action::kErr;
  } else if (action == "off") {
    a.action = Action::kOff;
  } else if (action.rfind("sleep(", 0) == 0 && action.back() == ')') {
    std::string ms = action.substr(6, action.size() - 7);
    char* end = nullptr;
    long v = std::strtol(ms.c_str(), &end, 10);
    if (ms.empty() || *end != '\0' || v < 0 || v > 600'000) {
      return Status::InvalidArgument("IDEM_FAILPOINT entry \"" + entry +
                                     "\": sleep(MS) needs 0..600000");
    }
    a.action = Action::kSleep;
    a.sleep_ms = static_cast<int>(v);
  } else {
    return Status::InvalidArgument("IDEM_FAILPOINT entry \"" + entry + "\": unknown action \"" +
                                   action + "\" (kill, err, sleep(MS), off)");
  }
  return a;
}

}  // namespace

const std::vector<Site>& KnownFailpoints() {
  static const std::vector<Site> sites = {
      {"intent.before_commit", "B0: spec and input validated, before the intent row commits"},
      {"intent.after_commit", "B1: intent committed, before the caller hears of it"},
      {"saga.after_start", "saga marked running, before its first step"},
      {"preview.after_call", "B2: two-phase preview answered, before it is journaled"},
      {"preview.after_journal",
       "B3: preview and commit token journaled, before approval or commit"},
      {"approval.after_commit",
       "approval journaled, before the token is spent and the tool called"},
      {"approval.after_counted",
       "an approval short of its policy's quorum journaled, before the answer"},
      {"guard.after_answer", "a step's guard answered, before its answer is journaled"},
      {"step.before_submitted", "step arguments resolved, before `submitted` is journaled"},
      {"step.after_submitted", "B4: `submitted` journaled, before the tool call"},
      {"provider.after_apply", "B6: provider applied the effect, before it answers"},
      {"step.after_call", "B6: tool answered, before the outcome is journaled"},
      {"step.after_outcome", "B7: step outcome journaled, before the next step"},
      {"unknown.after_recorded", "outcome journaled as unknown, before it is resolved"},
      {"completion.before_lookup",
       "a processing step's check is due (its wait journaled), before its status lookup"},
      {"completion.after_lookup",
       "a processing step's status lookup answered, before its answer is journaled"},
      {"compensation.before_submitted", "rollback chose a step, before its undo is journaled"},
      {"compensation.after_submitted", "B8: undo journaled as attempting, before the undo call"},
      {"provider.after_undo", "B9: provider applied the undo, before it answers"},
      {"compensation.after_call", "B9: undo answered, before its outcome is journaled"},
      {"compensation.after_outcome", "undo outcome journaled, before the next undo"},
      {"saga.before_terminal", "last outcome journaled, before the terminal state commits"},
      {"saga.after_terminal", "B10: terminal state committed, before the caller hears of it"},
      {"open.before_append", "an open saga's call, before its step is appended"},
      {"open.after_append", "an open saga's call appended, before it is driven"},
  };
  return sites;
}

Status Arm(const std::string& spec) {
  std::map<std::string, Armed> parsed;
  std::stringstream ss(spec);
  std::string entry;
  while (std::getline(ss, entry, ';')) {
    if (entry.empty()) continue;
    auto eq = entry.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument("IDEM_FAILPOINT entry \"" + entry +
                                     "\": expected name=action");
    }
    std::string name = entry.substr(0, eq);
    if (!IsKnown(name)) {
      return Status::InvalidArgument("IDEM_FAILPOINT entry \"" + entry +
                                     "\": unknown failpoint \"" + name +
                                     "\" (see `idem failpoints`)");
    }
    Result<Armed> a = ParseAction(entry, entry.substr(eq + 1));
    if (!a.ok()) return a.status();
    parsed[name] = *a;
  }
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [name, a] : parsed) r.armed[name] = a;
  return Status::Ok();
}

Status ArmFromEnv() {
  const char* env = std::getenv("IDEM_FAILPOINT");
  if (env == nullptr || *env == '\0') return Status::Ok();
  return Arm(env);
}

void DisarmAll() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.armed.clear();
  r.hits.clear();
}

bool Hit(const char* name) {
  Registry& r = Reg();
  Armed a;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    int count = ++r.hits[name];
    auto it = r.armed.find(name);
    if (it == r.armed.end()) return false;
    a = it->second;
    if (a.nth != 0 && count != a.nth) return false;
  }
  switch (a.action) {
    case Action::kOff:
      return false;
    case Action::kKill:
      std::raise(SIGKILL);
      std::abort();  // unreachable
    case Action::kErr:
      return true;
    case Action::kSleep:
      std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
      return false;
  }
  return false;
}

int HitCount(const std::string& name) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.hits.find(name);
  return it == r.hits.end() ? 0 : it->second;
}

}  // namespace idem::failpoint
