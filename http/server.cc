#include "http/server.h"

#include <array>
#include <chrono>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "common/tls_files.h"
#include "http/connection.h"
#include "http/response_writer.h"
#include "http/server_core.h"
#include <openssl/ssl.h>

namespace idem::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using TlsSocket = asio::ssl::stream<tcp::socket>;

namespace {

// The TLS context of `o` (TLS 1.2 or later), after the checks of
// common/tls_files.h. Errors name the option.
Result<std::unique_ptr<asio::ssl::context>> TlsContext(const ServerOptions& o) {
  IDEM_RETURN_IF_ERROR(
      CheckCertificateAndKey(o.tls_cert_file, "tls_cert_file", o.tls_key_file, "tls_key_file"));
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(o.tls_cert_file, ec);
  if (ec) {
    return Status::InvalidArgument("tls_cert_file: " + o.tls_cert_file + ": " + ec.message());
  }
  ctx->use_private_key_file(o.tls_key_file, asio::ssl::context::pem, ec);
  if (ec) return Status::InvalidArgument("tls_key_file: " + o.tls_key_file + ": " + ec.message());
  return ctx;
}

}  // namespace

// ---- ServerCore

void ServerCore::Register(const std::shared_ptr<ConnectionBase>& c) {
  std::lock_guard<std::mutex> lock(mu);
  live.emplace(c.get(), c);
}

void ServerCore::Unregister(ConnectionBase* c) {
  std::lock_guard<std::mutex> lock(mu);
  live.erase(c);
  if (live.empty()) idle_cv.notify_all();
}

void ServerCore::RegisterStream(const std::shared_ptr<StreamState>& s) {
  std::lock_guard<std::mutex> lock(mu);
  // Prune ended streams now and then, so the list stays the size of the live set.
  if (live_streams.size() >= 64 && live_streams.size() % 64 == 0) {
    std::vector<std::weak_ptr<StreamState>> kept;
    for (auto& w : live_streams) {
      auto p = w.lock();
      if (p != nullptr && p->open()) kept.push_back(std::move(w));
    }
    live_streams.swap(kept);
  }
  live_streams.push_back(s);
}

std::vector<std::shared_ptr<ConnectionBase>> ServerCore::Live() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::shared_ptr<ConnectionBase>> out;
  for (auto& [raw, weak] : live) {
    if (auto c = weak.lock()) out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::shared_ptr<StreamState>> ServerCore::LiveStreams() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::shared_ptr<StreamState>> out;
  for (auto& w : live_streams) {
    if (auto s = w.lock()) out.push_back(std::move(s));
  }
  return out;
}

bool ServerCore::WaitIdle(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu);
  return idle_cv.wait_for(lock, std::chrono::milliseconds(ms), [this] { return live.empty(); });
}

void ServerCore::Responded(int status) const {
  if (!hooks.responded) return;
  try {
    hooks.responded(status);
  } catch (...) {  // a metrics hook must not take a connection down
  }
}

// ---- Server

struct Server::Impl {
  Impl(ServerOptions o, Handler h, ServerHooks k, std::unique_ptr<asio::ssl::context> t)
      : tls(std::move(t)),
        core(std::move(o), std::move(h), std::move(k)),
        io(core.options.io_threads),
        acceptor(asio::make_strand(io)),
        retry_timer(acceptor.get_executor()) {}

  void Accept() {
    acceptor.async_accept(asio::make_strand(io),
                          [this](boost::system::error_code ec, tcp::socket socket) {
                            if (!acceptor.is_open()) return;
                            if (ec) {
                              // Out of descriptors or a transient network error: try again shortly
                              // rather than spin.
                              retry_timer.expires_after(std::chrono::milliseconds(50));
                              retry_timer.async_wait([this](boost::system::error_code) {
                                if (acceptor.is_open()) Accept();
                              });
                              return;
                            }
                            Admit(std::move(socket));
                            Accept();
                          });
  }

  void Admit(tcp::socket socket) {
    boost::system::error_code ec;
    tcp::endpoint remote = socket.remote_endpoint(ec);
    if (ec) return;  // already gone
    std::string peer = remote.address().to_string();
    auto ticket = core.connections.TryAcquire(peer);
    if (!ticket || core.stopping) {
      // Refused at once: a 503 if the socket takes it without waiting, then close.
      core.refused++;
      core.Responded(503);
      socket.non_blocking(true, ec);
      if (tls == nullptr) {  // (a TLS client could not read a plain answer)
        std::string_view text = OverloadedResponse();
        socket.write_some(asio::buffer(text.data(), text.size()), ec);
      }
      socket.shutdown(tcp::socket::shutdown_send, ec);
      // Drop what has already arrived (without waiting): closing over unread
      // input would reset the connection and could take the 503 with it.
      std::array<char, 4096> scratch;
      for (int i = 0; i < 16 && !ec; ++i) socket.read_some(asio::buffer(scratch), ec);
      socket.close(ec);
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    core.accepted++;
    if (tls != nullptr) {
      std::make_shared<Connection<TlsSocket>>(TlsSocket(std::move(socket), *tls), &core,
                                              std::move(*ticket), std::move(peer))
          ->Start();
      return;
    }
    std::make_shared<Connection<tcp::socket>>(std::move(socket), &core, std::move(*ticket),
                                              std::move(peer))
        ->Start();
  }

  std::unique_ptr<asio::ssl::context> tls;  // null: plain HTTP; outlives every connection
  ServerCore core;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::vector<std::thread> threads;
  int port = 0;
  bool started = false;
  bool stopped = false;
};

Result<std::unique_ptr<Server>> Server::Create(ServerOptions o, Handler handler,
                                               ServerHooks hooks) {
  auto bad = [](const char* what) { return Status::InvalidArgument(std::string(what)); };
  if (!handler) return bad("handler: required");
  if (o.port < 0 || o.port > 65535) return bad("port: out of range");
  if (o.io_threads < 1 || o.io_threads > 64) return bad("io_threads: 1..64");
  if (o.worker_threads < 1 || o.worker_threads > 1024) return bad("worker_threads: 1..1024");
  if (o.max_header_bytes < 256) return bad("max_header_bytes: at least 256");
  if (o.max_header_fields < 1) return bad("max_header_fields: at least 1");
  if (o.request_timeout_ms < 1 || o.keep_alive_idle_ms < 1 || o.write_timeout_ms < 1 ||
      o.stop_timeout_ms < 0) {
    return bad("timeouts: must be positive");
  }
  if (o.max_requests_per_connection < 1) return bad("max_requests_per_connection: at least 1");
  if (o.max_connections < 1 || o.max_connections_per_client < 1) {
    return bad("max_connections: at least 1");
  }
  if (o.max_stream_queue_bytes < 1024) return bad("max_stream_queue_bytes: at least 1024");
  std::unique_ptr<asio::ssl::context> tls;
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return bad("tls_cert_file, tls_key_file: both or neither");
  }
  if (!o.tls_cert_file.empty()) {
    Result<std::unique_ptr<asio::ssl::context>> ctx = TlsContext(o);
    if (!ctx.ok()) return ctx.status();
    tls = std::move(ctx).value();
  }
  return std::unique_ptr<Server>(new Server(
      std::make_unique<Impl>(std::move(o), std::move(handler), std::move(hooks), std::move(tls))));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

Status Server::Start() {
  Impl& m = *impl_;
  if (m.started) return Status::FailedPrecondition("http server: already started");
  boost::system::error_code ec;
  tcp::endpoint endpoint;
  auto address = asio::ip::make_address(m.core.options.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, static_cast<unsigned short>(m.core.options.port));
  } else {
    tcp::resolver resolver(m.io);
    auto results = resolver.resolve(m.core.options.host, std::to_string(m.core.options.port), ec);
    if (ec || results.empty()) {
      return Status::Unavailable("http server: cannot resolve " + m.core.options.host);
    }
    endpoint = results.begin()->endpoint();
  }
  auto fail = [&](const char* what) {
    boost::system::error_code ignored;
    m.acceptor.close(ignored);
    return Status::Unavailable(std::string("http server: ") + what + " " + m.core.options.host +
                               ":" + std::to_string(m.core.options.port) + ": " + ec.message());
  };
  m.acceptor.open(endpoint.protocol(), ec);
  if (ec) return fail("cannot open");
  m.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  m.acceptor.bind(endpoint, ec);
  if (ec) return fail("cannot bind");
  m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("cannot listen on");
  m.port = m.acceptor.local_endpoint(ec).port();
  m.started = true;
  m.guard.emplace(m.io.get_executor());
  m.Accept();
  for (int i = 0; i < m.core.options.io_threads; ++i) {
    m.threads.emplace_back([&m] { m.io.run(); });
  }
  return Status::Ok();
}

int Server::port() const { return impl_->port; }

ServerStats Server::stats() const {
  const ServerCore& c = impl_->core;
  ServerStats s;
  s.connections = c.connections.total();
  s.streams = c.streams.total();
  s.accepted = c.accepted;
  s.refused = c.refused;
  s.requests = c.requests;
  s.rejected_requests = c.rejected_requests;
  return s;
}

void Server::Stop() {
  Impl& m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopped = true;
  m.core.stopping = true;
  // 1. Stop accepting (on the acceptor's strand).
  std::promise<void> closed;
  asio::post(m.acceptor.get_executor(), [&m, &closed] {
    boost::system::error_code ignored;
    m.acceptor.close(ignored);
    m.retry_timer.cancel();
    closed.set_value();
  });
  closed.get_future().wait();
  // 2. Idle connections and streams close; in-flight responses finish.
  for (auto& c : m.core.Live()) c->Shutdown();
  if (!m.core.WaitIdle(m.core.options.stop_timeout_ms)) {
    // 3. What is left past the bound is closed.
    for (auto& c : m.core.Live()) c->Abort();
  }
  // 4. No stream posts to a connection any more (see stream_state.h).
  for (auto& s : m.core.LiveStreams()) s->MarkClosed();
  // 5. Running handlers finish (their answers find their connections closed).
  m.core.workers.join();
  m.core.WaitIdle(1000);
  m.guard.reset();
  m.io.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
}

}  // namespace idem::http
