#include "storage/prune.h"

#include <algorithm>

namespace idem::storage {
namespace {

bool Named(const std::vector<std::string>& names, const std::string& key) {
  return std::find(names.begin(), names.end(), key) != names.end();
}

Json Redact(const Json& v, const std::vector<std::string>& names, int depth) {
  if (depth > 64 || !v.is_structured()) return v;
  Json out = v;
  if (out.is_object()) {
    for (auto it = out.begin(); it != out.end(); ++it) {
      it.value() = Named(names, it.key()) ? Json(kRedacted) : Redact(it.value(), names, depth + 1);
    }
  } else {
    for (Json& child : out) child = Redact(child, names, depth + 1);
  }
  return out;
}

}  // namespace

const std::vector<std::string>& PrunedJournalFields() {
  static const std::vector<std::string>* fields =
      new std::vector<std::string>{"args", "result", "changes", "summary", "input", "note"};
  return *fields;
}

Json PruneDocument(const Json& v, const std::vector<std::string>& redact) {
  if (redact.empty()) return Json();
  return Redact(v, redact, 0);
}

Json PruneJournalData(const Json& data, const std::vector<std::string>& redact) {
  if (!redact.empty()) return Redact(data, redact, 0);
  if (!data.is_object()) return data;
  Json out = data;
  for (const std::string& f : PrunedJournalFields()) {
    if (out.contains(f)) out[f] = nullptr;
  }
  return out;
}

Json PrunedEntryData(const PruneRequest& request) {
  Json data = {{"mode", request.redact.empty() ? "all" : "redact"}};
  if (!request.redact.empty()) data["fields"] = request.redact;
  return data;
}

Status CheckPruneRequest(const PruneRequest& request) {
  if (request.states.empty()) return Status::InvalidArgument("prune: no states to prune in");
  if (request.batch_sagas < 1 || request.batch_sagas > 1000) {
    return Status::InvalidArgument("prune: batch size " + std::to_string(request.batch_sagas) +
                                   " is outside 1..1000");
  }
  for (const std::string& f : request.redact) {
    if (f.empty() || f.find_first_not_of(" \t") == std::string::npos) {
      return Status::InvalidArgument("prune: --redact: a field name must not be blank");
    }
  }
  return Status::Ok();
}

}  // namespace idem::storage
