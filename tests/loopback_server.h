#pragma once
// A real idem server on an ephemeral loopback port, for the tests that talk
// to it over HTTP: created and started by Start, stopped by Stop or when the
// object goes away (before the store and tools it was given, which the test
// owns and must keep alive until then).

#include <memory>
#include <utility>

#include <gtest/gtest.h>

#include "server/server.h"
#include "tests/test_util.h"

namespace idem::test {

class LoopbackServer {
 public:
  LoopbackServer() = default;
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;
  ~LoopbackServer() { Stop(); }

  /// Creates and starts a server over `store` and `tools` with `options`,
  /// on 127.0.0.1 and a port the system picks; a fatal test failure when it
  /// cannot (call it under ASSERT_NO_FATAL_FAILURE).
  void Start(storage::Store* store, const ToolRegistry* tools, server::ServerOptions options) {
    options.host = "127.0.0.1";
    options.port = 0;
    auto created = server::Server::Create(store, tools, std::move(options));
    ASSERT_OK(created);
    server_ = std::move(created).value();
    ASSERT_OK(server_->Start());
    port_ = server_->port();
  }
  void Stop() {
    if (server_) server_->Stop();
    server_.reset();
  }
  int port() const { return port_; }

 private:
  std::unique_ptr<server::Server> server_;
  int port_ = 0;
};

}  // namespace idem::test
