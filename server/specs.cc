// The spec resource: register versions, list them, read one.

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "saga/spec.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"

namespace idem::server {

void PutSpec(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent});
  if (p == nullptr) return;
  const std::string name = req.matches[1];
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
  if (!doc.contains("version")) {
    auto latest = ctx.specs->Get(name, 0);
    if (!latest.ok() && latest.status().code() != Code::kNotFound) {
      return ProblemFor(res, latest.status());
    }
    doc["version"] = latest.ok() ? latest->version + 1 : 1;
  }
  auto spec = ParseSpec(doc, *ctx.tools);
  if (!spec.ok()) {
    return Problem(res, 422, "invalid-spec", "Invalid saga spec", spec.status().message());
  }
  auto put = ctx.specs->Put(name, spec->version, doc, p->name);
  if (!put.ok()) {
    if (put.status().code() == Code::kConflict) {
      return Problem(res, 409, "spec-version-exists", "Spec version exists",
                     put.status().message());
    }
    return ProblemFor(res, put.status());
  }
  res.SetHeader("Location",
                "/v1/specs/" + name + "?version=" + std::to_string(put->version.version));
  SendJson(res, put->created ? 201 : 200, SpecView(put->version, true));
}

void ListSpecs(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  if (ctx.auth->Authorize(req, res, {kRoleAgent, kRoleApprover}) == nullptr) return;
  auto all = ctx.specs->List();
  if (!all.ok()) return ProblemFor(res, all.status());
  std::map<std::string, Json> by_name;
  for (const SpecVersion& v : *all) {
    Json& e = by_name[v.name];
    if (e.is_null()) e = {{"name", v.name}, {"latest_version", 0}, {"versions", Json::array()}};
    e["versions"].push_back(SpecView(v, false));
    e["latest_version"] = std::max(e["latest_version"].get<int>(), v.version);
  }
  Json list = Json::array();
  for (auto& [n, e] : by_name) list.push_back(std::move(e));
  SendJson(res, 200, {{"specs", list}});
}

void GetSpec(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  if (ctx.auth->Authorize(req, res, {kRoleAgent, kRoleApprover}) == nullptr) return;
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
  auto found = ctx.specs->Get(req.matches[1], version);
  if (!found.ok()) return ProblemFor(res, found.status());
  SendJson(res, 200, SpecView(*found, true));
}

}  // namespace idem::server
