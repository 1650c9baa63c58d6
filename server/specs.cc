// The spec resource: register versions, list them, read one.

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "saga/spec.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"

namespace idem::server {

namespace {

// Approvers read every spec (they judge what sagas do); agents their own and
// shared ones.
bool MayRead(const Principal& p, const storage::SpecOwner& owner) {
  return SpecRegistry::MayUse(owner, p.name) || HasRole(p, kRoleApprover);
}

Json OwnedSpecView(const SpecVersion& v, const storage::SpecOwner& owner, bool with_doc) {
  Json out = SpecView(v, with_doc);
  out["owner"] = owner.owner;
  out["shared"] = owner.shared;
  return out;
}

void NotOwned(HttpResponse& res, const std::string& name) {
  Problem(res, 403, "spec-not-owned", "Spec owned by another caller",
          "spec " + name +
              " belongs to another caller; only its owner adds versions (register "
              "yours under another name)");
}

}  // namespace

void NotShared(HttpResponse& res, const std::string& name) {
  Problem(res, 403, "spec-not-shared", "Spec not shared",
          "spec " + name + " belongs to another caller, who has not shared it");
}

void PutSpec(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent});
  if (p == nullptr) return;
  const std::string name = req.matches[1];
  std::optional<bool> shared;
  if (req.HasParam("shared")) {
    const std::string v = req.Param("shared");
    if (v != "true" && v != "false") {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "shared: expected true or false");
    }
    shared = v == "true";
  }
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth);
  if (!body) return;
  if (!body->is_object()) {
    return Problem(res, 400, "invalid-request", "Invalid request", "body: expected a spec object");
  }
  Json doc = *body;
  if (!doc.contains("name")) doc["name"] = name;
  if (doc["name"] != name) {
    return Problem(res, 422, "invalid-spec", "Invalid saga spec",
                   "name: the spec is named " + doc["name"].dump() + ", the path " + name);
  }
  // Another caller's name is refused before anything else: never a version.
  auto owner = ctx.specs->Owner(name);
  if (!owner.ok() && owner.status().code() != Code::kNotFound) {
    return ProblemFor(res, owner.status());
  }
  if (owner.ok() && owner->owner != p->name) return NotOwned(res, name);
  if (!doc.contains("version")) {
    auto latest = ctx.specs->Get(name, 0);
    if (!latest.ok() && latest.status().code() != Code::kNotFound) {
      return ProblemFor(res, latest.status());
    }
    if (latest.ok()) {
      // The latest version's content again is that version (idempotent);
      // other content is the next one.
      Json same = doc;
      same["version"] = latest->version;
      const bool unchanged = Fingerprint(same) == latest->fingerprint;
      doc["version"] = unchanged ? latest->version : latest->version + 1;
    } else {
      doc["version"] = 1;
    }
  }
  auto spec = ParseSpec(doc, *ctx.tools);
  if (!spec.ok()) {
    return Problem(res, 422, "invalid-spec", "Invalid saga spec", spec.status().message());
  }
  // The claim settles a race between two callers' first puts of a name.
  auto claimed = ctx.specs->Claim(name, p->name);
  if (!claimed.ok()) return ProblemFor(res, claimed.status());
  if (claimed->owner != p->name) return NotOwned(res, name);
  auto put = ctx.specs->Put(name, spec->version, doc, p->name);
  if (!put.ok()) {
    if (put.status().code() == Code::kConflict) {
      return Problem(res, 409, "spec-version-exists", "Spec version exists",
                     put.status().message());
    }
    return ProblemFor(res, put.status());
  }
  if (shared && *shared != claimed->shared) {
    Status set = ctx.specs->SetShared(name, *shared);
    if (!set.ok()) return ProblemFor(res, set);
    claimed->shared = *shared;
  }
  res.SetHeader("Location",
                "/v1/specs/" + name + "?version=" + std::to_string(put->version.version));
  SendJson(res, put->created ? 201 : 200, OwnedSpecView(put->version, *claimed, true));
}

void ListSpecs(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent, kRoleApprover});
  if (p == nullptr) return;
  auto owners = ctx.specs->Owners();
  if (!owners.ok()) return ProblemFor(res, owners.status());
  std::map<std::string, storage::SpecOwner> readable;
  for (const storage::SpecOwner& o : *owners) {
    if (MayRead(*p, o)) readable.emplace(o.name, o);
  }
  auto all = ctx.specs->List();
  if (!all.ok()) return ProblemFor(res, all.status());
  std::map<std::string, Json> by_name;
  for (const SpecVersion& v : *all) {
    auto owner = readable.find(v.name);
    if (owner == readable.end()) continue;
    Json& e = by_name[v.name];
    if (e.is_null()) {
      e = {{"name", v.name},
           {"owner", owner->second.owner},
           {"shared", owner->second.shared},
           {"latest_version", 0},
           {"versions", Json::array()}};
    }
    e["versions"].push_back(SpecView(v, false));
    e["latest_version"] = std::max(e["latest_version"].get<int>(), v.version);
  }
  Json list = Json::array();
  for (auto& [n, e] : by_name) list.push_back(std::move(e));
  SendJson(res, 200, {{"specs", list}});
}

void GetSpec(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent, kRoleApprover});
  if (p == nullptr) return;
  int version = 0;
  if (req.HasParam("version")) {
    std::string v = req.Param("version");
    bool digits = !v.empty() && v.size() <= 9 &&
                  std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
    version = digits ? std::stoi(v) : 0;
    if (version < 1) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "version: expected a positive integer");
    }
  }
  const std::string name = req.matches[1];
  auto owner = ctx.specs->Owner(name);
  if (!owner.ok()) return ProblemFor(res, owner.status());
  if (!MayRead(*p, *owner)) return NotShared(res, name);
  auto found = ctx.specs->Get(name, version);
  if (!found.ok()) return ProblemFor(res, found.status());
  SendJson(res, 200, OwnedSpecView(*found, *owner, true));
}

}  // namespace idem::server
