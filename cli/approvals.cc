#include "cli/approvals.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "saga/states.h"
#include "saga/views.h"
#include "server/server.h"

#include "common/principal_name.h"
#include <sys/stat.h>

namespace idem::cli {
namespace {

Status Usage(const std::string& message) { return Status::InvalidArgument(message); }

// The bearer token in `path` (surrounding whitespace dropped). The file must
// be readable by its owner only, as an SSH key is.
Result<std::string> ReadCredentialFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Usage("--credential @" + path + ": cannot read the credential file");
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Usage("--credential @" + path +
                 ": group or others may read the credential file; make it the owner's only "
                 "(chmod 600 " +
                 path + ")");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Usage("--credential @" + path + ": cannot read the credential file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  const size_t begin = token.find_first_not_of(" \t\r\n");
  const size_t end = token.find_last_not_of(" \t\r\n");
  token = begin == std::string::npos ? "" : token.substr(begin, end - begin + 1);
  if (token.empty()) return Usage("--credential @" + path + ": the credential file is empty");
  return token;
}

}  // namespace

std::string CredentialHint() {
  return std::string(
             "pass --auth FILE (the auth file of `idem serve --auth FILE`) with "
             "--credential @FILE (a file holding your bearer token, chmod 600) or the "
             "environment variable ") +
         kCredentialEnv + "=TOKEN";
}

Result<ApprovalDecision> ResolveDecider(const DeciderFlags& flags, const char* env_credential) {
  if (!flags.roles.empty()) {
    return Usage(
        "--role is no longer taken on the command line's word: the roles come from the "
        "auth file; " +
        CredentialHint());
  }
  std::string token;
  if (!flags.credential.empty()) {
    if (flags.credential[0] != '@') {
      return Usage(std::string("--credential: give @FILE, a file holding the bearer token, or "
                               "set ") +
                   kCredentialEnv + "; a token on the command line is visible to every local user");
    }
    auto read = ReadCredentialFile(flags.credential.substr(1));
    if (!read.ok()) return read.status();
    token = std::move(read).value();
  } else if (env_credential != nullptr && env_credential[0] != '\0') {
    token = env_credential;
  }
  ApprovalDecision d;
  if (token.empty()) {
    if (!flags.auth_path.empty()) {
      return Usage("--auth " + flags.auth_path + " needs your credential: --credential @FILE or " +
                   kCredentialEnv + "=TOKEN");
    }
    if (flags.who.empty()) {
      return Usage("say who decides: " + CredentialHint() +
                   " (needed for a commit under an approval policy), or --as NAME for an "
                   "\"approval\": \"human\" commit");
    }
    d.who = flags.who;  // the command line's word: not authenticated
    return d;
  }
  if (flags.auth_path.empty()) {
    return Usage(
        "a credential is checked against the auth file: give --auth FILE (the file "
        "`idem serve --auth FILE` reads)");
  }
  auto principals = server::LoadPrincipals(flags.auth_path);
  if (!principals.ok()) return principals.status();
  const server::Principal* p = server::PrincipalForToken(*principals, token);
  if (p == nullptr) {
    return Usage("the credential matches no caller of " + flags.auth_path);
  }
  if (!flags.who.empty() && !SameName(flags.who, p->name)) {
    return Usage("--as " + flags.who + ", but the credential is " + p->name +
                 "'s: drop --as, or use your own credential");
  }
  d.who = p->name;
  d.roles = p->roles;
  d.authenticated = true;
  return d;
}

Json PendingApprovals(storage::Store* store, Status* error) {
  Json out = Json::array();
  storage::SagaFilter f;
  f.states = {SagaStateName(SagaState::kAwaitingApproval)};
  auto list = store->ListSagas(f);
  if (!list.ok()) {
    *error = list.status();
    return out;
  }
  for (const auto& sum : *list) {
    auto rec = store->LoadSaga(sum.saga_id);
    if (!rec.ok()) {
      *error = rec.status();
      return out;
    }
    for (const auto& st : rec->steps) {
      auto view = ApprovalView(sum.saga_id, st);
      if (!view) continue;
      (*view)["intent_key"] = sum.intent_key;
      out.push_back(std::move(*view));
    }
  }
  return out;
}

std::string PolicyLine(const Json& p) {
  const Json& policy = p["policy"];
  const std::string role = policy.value("role", "approver");
  const int quorum = policy.value("quorum", 1);
  std::string out = policy["rule"].is_number()
                        ? "rule " + std::to_string(policy["rule"].get<int>()) + ": "
                        : std::string("\"approval\": \"human\": ");
  out += std::to_string(quorum) + " distinct " + role + " approval(s)";
  std::string names;
  for (const auto& a : p["approvals"]) names += (names.empty() ? "" : ", ") + a.value("by", "");
  const int have = static_cast<int>(p["approvals"].size());
  if (have > 0) out += "; " + std::to_string(have) + " so far (" + names + ")";
  out += "; " + std::to_string(quorum - have) + " more, from anyone with the role " + role +
         (have > 0 ? " but " + names : "") + " who did not request the saga";
  return out;
}

}  // namespace idem::cli
