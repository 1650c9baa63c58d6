#include "saga/schedule.h"

#include <algorithm>

namespace idem {
namespace {

std::string Quoted(const std::string& s) { return Json(s).dump(); }

Status Error(const std::string& path, const std::string& message) {
  return Status::InvalidArgument(path + ": " + message);
}

std::string AfterPath(size_t index) { return "steps[" + std::to_string(index) + "].after"; }

// Depth-first search for a cycle through the parents of `i`. `color`: 0 not
// seen, 1 on the current path, 2 done. On a cycle, `path` holds it from its
// first step to the step that closes it.
bool FindCycle(int i, const std::vector<std::vector<int>>& parents, std::vector<int>* color,
               std::vector<int>* path) {
  (*color)[i] = 1;
  path->push_back(i);
  for (int p : parents[i]) {
    if ((*color)[p] == 1) {
      path->erase(path->begin(), std::find(path->begin(), path->end(), p));
      path->push_back(p);
      return true;
    }
    if ((*color)[p] == 0 && FindCycle(p, parents, color, path)) return true;
  }
  path->pop_back();
  (*color)[i] = 2;
  return false;
}

}  // namespace

Result<StepGraph> ParseStepGraph(const Json& steps, const std::map<std::string, size_t>& first_at) {
  StepGraph g;
  const size_t n = steps.size();
  for (const Json& s : steps) g.declared |= s.contains("after");
  g.parents.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Json& s = steps[i];
    if (!g.declared) {
      if (i > 0) g.parents[i].push_back(static_cast<int>(i - 1));  // today's order
      continue;
    }
    auto after = s.find("after");
    if (after == s.end()) {
      if (i == 0) continue;  // nothing before it either way
      return Error(AfterPath(i),
                   "required, since other steps say \"after\": every step but the first says "
                   "what it runs after (\"after\": [] for nothing)");
    }
    for (size_t k = 0; k < after->size(); ++k) {
      const std::string& id = (*after)[k].get_ref<const std::string&>();
      const std::string at = AfterPath(i) + "[" + std::to_string(k) + "]";
      auto it = first_at.find(id);
      if (it == first_at.end()) return Error(at, "unknown step " + Quoted(id));
      if (it->second == i) return Error(at, "step " + Quoted(id) + " cannot run after itself");
      int p = static_cast<int>(it->second);
      if (std::find(g.parents[i].begin(), g.parents[i].end(), p) != g.parents[i].end()) {
        return Error(at, "step " + Quoted(id) + " is listed twice");
      }
      g.parents[i].push_back(p);
    }
  }
  std::vector<int> color(n, 0);
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> path;
    if (color[i] == 0 && FindCycle(static_cast<int>(i), g.parents, &color, &path)) {
      // path: a, b (a runs after b), ..., a. Written in run order: a's parent first.
      std::string text;
      for (auto it = path.rbegin(); it != path.rend(); ++it) {
        if (!text.empty()) text += " -> ";
        text += Quoted(steps[*it].at("id").get<std::string>());
      }
      return Error(AfterPath(path.front()), "cycle " + text);
    }
  }
  // Ancestors, by a walk from each step (at most 100 steps: the schema's cap).
  g.before.assign(n, std::vector<bool>(n, false));
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> todo(g.parents[i].begin(), g.parents[i].end());
    while (!todo.empty()) {
      int j = todo.back();
      todo.pop_back();
      if (g.before[i][j]) continue;
      g.before[i][j] = true;
      todo.insert(todo.end(), g.parents[j].begin(), g.parents[j].end());
    }
  }
  return g;
}

std::vector<int> ReadySteps(const std::vector<std::vector<int>>& parents,
                            const std::vector<StepState>& states) {
  std::vector<int> out;
  for (size_t i = 0; i < states.size() && i < parents.size(); ++i) {
    switch (states[i]) {
      case StepState::kPlanned:
      case StepState::kPreviewed:
      case StepState::kAwaitingApproval:
      case StepState::kSubmitted:
      case StepState::kUnknown:
        break;
      case StepState::kProcessing:
        continue;  // in flight at its provider: driven when its check is due
      default:
        continue;  // ended, parked or rolling back
    }
    bool ready = std::all_of(parents[i].begin(), parents[i].end(),
                             [&](int p) { return states[p] == StepState::kSucceeded; });
    if (ready) out.push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace idem
