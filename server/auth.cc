#include "server/auth.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "saga/approval_policy.h"
#include "server/problem.h"

#include "common/json_util.h"
#include "common/principal_name.h"
#include <openssl/crypto.h>
#include <sys/stat.h>

namespace idem::server {
namespace {

constexpr size_t kMaxBearerBytes = 4096;

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost" || host.rfind("127.", 0) == 0;
}

Result<std::vector<Principal>> ParsePrincipals(const std::string& json_text) {
  auto doc = ParseJson(json_text, "auth", 8);
  if (!doc.ok()) return doc.status();
  if (!doc->is_array()) return Status::InvalidArgument("auth: expected a JSON array");
  std::vector<Principal> out;
  std::set<std::string> hashes;
  for (size_t i = 0; i < doc->size(); ++i) {
    const Json& e = (*doc)[i];
    std::string at = "auth[" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::InvalidArgument(at + ": expected an object");
    for (const auto& [k, v] : e.items()) {
      if (k != "name" && k != "token_sha256" && k != "roles") {
        return Status::InvalidArgument(at + ": unknown field \"" + PrintableText(k) + "\"");
      }
    }
    Principal p;
    if (!e.contains("name") || !e["name"].is_string()) {
      return Status::InvalidArgument(at + ".name: expected a string");
    }
    p.name = e["name"].get<std::string>();
    if (std::string problem = PrincipalNameProblem(p.name); !problem.empty()) {
      return Status::InvalidArgument(at + ".name: " + problem);
    }
    if (!e.contains("token_sha256") || !e["token_sha256"].is_string() ||
        !IsHex64(p.token_sha256 = e["token_sha256"].get<std::string>())) {
      return Status::InvalidArgument(at + ".token_sha256: expected 64 lower-case hex digits");
    }
    if (!e.contains("roles") || !e["roles"].is_array() || e["roles"].empty()) {
      return Status::InvalidArgument(at + ".roles: expected a non-empty array");
    }
    for (size_t r = 0; r < e["roles"].size(); ++r) {
      const Json& role = e["roles"][r];
      // agent, approver and operator are the API's; any other name is a
      // role an approval policy may ask for (saga/approval_policy.h).
      if (!role.is_string() || !IsRoleName(role.get<std::string>())) {
        return Status::InvalidArgument(at + ".roles[" + std::to_string(r) +
                                       "]: expected \"agent\", \"approver\", \"operator\" or "
                                       "a role of an approval policy ([a-z][a-z0-9_.-]{0,63})");
      }
      if (std::find(p.roles.begin(), p.roles.end(), role) != p.roles.end()) {
        return Status::InvalidArgument(at + ".roles[" + std::to_string(r) + "]: \"" +
                                       role.get<std::string>() + "\" appears twice");
      }
      p.roles.push_back(role.get<std::string>());
    }
    if (!hashes.insert(p.token_sha256).second) {
      return Status::InvalidArgument(at + ".token_sha256: the same token appears twice");
    }
    out.push_back(std::move(p));
  }
  IDEM_RETURN_IF_ERROR(CheckDistinctNames(out, "auth"));
  return out;
}

Status CheckDistinctNames(const std::vector<Principal>& principals, const std::string& list) {
  // One person, one name: names that fold alike (NFKC + case fold) would
  // count twice toward a quorum, or let a requester approve as another.
  std::map<std::string, size_t> seen;  // folded name -> the first entry with it
  for (size_t i = 0; i < principals.size(); ++i) {
    const std::string& name = principals[i].name;
    auto [first, fresh] = seen.emplace(FoldName(name), i);
    if (fresh) continue;
    const std::string& other = principals[first->second].name;
    return Status::InvalidArgument(
        list + "[" + std::to_string(i) + "].name: " + Json(name).dump() + " and " + list + "[" +
        std::to_string(first->second) + "].name " + Json(other).dump() +
        (other == name ? std::string(" are the same name")
                       : " are one name to idem (compared after Unicode NFKC normalization and "
                         "case folding)") +
        ": give each caller its own name");
  }
  return Status::Ok();
}

const Principal* PrincipalForToken(const std::vector<Principal>& principals,
                                   const std::string& token) {
  const std::string hash = Sha256Hex(token);
  const Principal* found = nullptr;
  for (const Principal& p : principals) {  // every entry: no early exit
    if (CRYPTO_memcmp(p.token_sha256.data(), hash.data(), hash.size()) == 0) found = &p;
  }
  return found;
}

Result<std::vector<Principal>> LoadPrincipals(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::NotFound(path + ": cannot read the auth file");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Status::FailedPrecondition(path + ": group or others may write the auth file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot read the auth file");
  std::stringstream ss;
  ss << in.rdbuf();
  auto out = ParsePrincipals(ss.str());
  if (!out.ok()) return Status::InvalidArgument(path + ": " + out.status().message());
  if (out->empty()) {
    // Not "no --auth file": the file was given and lists nobody.
    return Status::InvalidArgument(
        path +
        ": the auth file is an empty caller list ([]): nobody could call the server; "
        "add a caller {\"name\", \"token_sha256\", \"roles\"}, or drop --auth and "
        "serve with --insecure-no-auth on loopback");
  }
  return out;
}

const Principal* Authenticator::Identify(const HttpRequest& req) const {
  static const Principal anonymous{kAnonymous, "", {kRoleAgent, kRoleApprover, kRoleOperator}};
  if (principals_.empty()) return &anonymous;          // insecure_no_auth
  if (req.principal != nullptr) return req.principal;  // a web UI session's
  const std::string h = req.Header("Authorization");
  if (h.size() < 8 || h.size() > kMaxBearerBytes) return nullptr;
  std::string scheme = h.substr(0, 7);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (scheme != "bearer ") return nullptr;
  std::string token = h.substr(7);
  while (!token.empty() && token.front() == ' ') token.erase(0, 1);
  if (token.empty()) return nullptr;
  return PrincipalForToken(principals_, token);
}

const Principal* Authenticator::IdentifyToken(const std::string& token) const {
  HttpRequest req;
  req.headers.emplace("Authorization", "Bearer " + token);
  return Identify(req);
}

bool MayDecideApprovals(const Principal& p) {
  for (const auto& r : p.roles) {
    if (r != kRoleAgent && r != kRoleOperator) return true;
  }
  return false;
}

const Principal* Authenticator::Find(const std::string& name) const {
  for (const Principal& p : principals_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

const Principal* Authenticator::Authorize(const HttpRequest& req, HttpResponse& res,
                                          std::initializer_list<const char*> roles) const {
  const Principal* p = Identify(req);
  if (p == nullptr) {
    res.SetHeader("WWW-Authenticate", "Bearer realm=\"idem\"");
    Problem(res, 401, "unauthorized", "Unauthorized",
            "a valid bearer token is required (Authorization: Bearer <token>)");
    return nullptr;
  }
  for (const char* role : roles) {
    if (std::find(p->roles.begin(), p->roles.end(), role) != p->roles.end()) return p;
  }
  std::string want;
  for (const char* role : roles) want += (want.empty() ? "" : " or ") + std::string(role);
  Problem(res, 403, "forbidden", "Forbidden", "this operation needs the role " + want);
  return nullptr;
}

}  // namespace idem::server
