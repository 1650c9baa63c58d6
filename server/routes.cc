#include "server/routes.h"

#include "server/handlers.h"

namespace idem::server {
namespace {

using Fn = void (*)(ServerContext&, const HttpRequest&, HttpResponse&);

Route R(const char* method, const char* pattern, ServerContext* ctx, Fn fn) {
  return {method, pattern,
          [ctx, fn](const HttpRequest& req, HttpResponse& res) { fn(*ctx, req, res); }};
}

Route Decision(const char* pattern, ServerContext* ctx, bool approve) {
  return {"POST", pattern, [ctx, approve](const HttpRequest& req, HttpResponse& res) {
            DecideApproval(*ctx, req, res, approve);
          }};
}

}  // namespace

std::vector<Route> ApiRoutes(ServerContext* ctx) {
  return {
      R("POST", "/v1/sagas", ctx, PostSaga),
      R("GET", "/v1/sagas", ctx, ListSagas),
      R("GET", R"(/v1/sagas/([A-Za-z0-9_-]{1,128}))", ctx, GetSaga),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/cancel)", ctx, CancelSaga),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/pause)", ctx, PauseSaga),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/resume)", ctx, ResumeSaga),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/resolve)", ctx, ResolveSaga),
      R("POST", "/v1/open-sagas", ctx, PostOpenSaga),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/calls)", ctx, PostCall),
      R("GET", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/calls/([!-~]{1,200}))", ctx, GetCall),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/commit)", ctx, CommitOpenSaga),
      R("POST", R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/rollback)", ctx, RollbackOpenSaga),
      R("PUT", R"(/v1/specs/([a-z0-9_.-]{1,64}))", ctx, PutSpec),
      R("GET", "/v1/specs", ctx, ListSpecs),
      R("GET", R"(/v1/specs/([a-z0-9_.-]{1,64}))", ctx, GetSpec),
      R("GET", "/v1/approvals", ctx, ListApprovals),
      Decision(R"(/v1/approvals/([A-Za-z0-9_.-]{1,1024})/approve)", ctx, true),
      Decision(R"(/v1/approvals/([A-Za-z0-9_.-]{1,1024})/reject)", ctx, false),
      R("GET", "/healthz", ctx, Healthz),
      R("GET", "/readyz", ctx, Readyz),
      R("GET", "/metrics", ctx, MetricsPage),
  };
}

}  // namespace idem::server
