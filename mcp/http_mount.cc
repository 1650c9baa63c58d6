#include "mcp/http_mount.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "server/context.h"
#include "server/spec_registry.h"

namespace idem::mcp {

std::unique_ptr<HttpTransport> MountOnServer(server::ServerContext* ctx) {
  HttpOptions ho;
  ho.allowed_origins = ctx->options->mcp.allowed_origins;
  ho.allowed_hosts = ctx->options->mcp.allowed_hosts;
  ho.listen_host = ctx->options->host;
  auto backend_for = [ctx](const std::string& principal) {
    Backend b;
    b.engine = ctx->engine;
    b.store = ctx->store;
    b.tools = ctx->tools;
    b.specs = [ctx, principal] {
      std::vector<SpecSource> out;
      auto all = ctx->specs->List();
      if (!all.ok()) return out;
      std::map<std::string, const server::SpecVersion*> latest;
      for (const server::SpecVersion& v : *all) {
        auto& slot = latest[v.name];
        if (slot == nullptr || v.version > slot->version) slot = &v;
      }
      for (const auto& [name, v] : latest) {
        auto owner = ctx->specs->Owner(name);
        if (owner.ok() && !server::SpecRegistry::MayUse(*owner, principal)) continue;
        out.push_back(SpecSource{name, v->version, v->doc});
      }
      return out;
    };
    return b;
  };
  return std::make_unique<HttpTransport>(std::move(backend_for), ctx->auth, ho);
}

}  // namespace idem::mcp
