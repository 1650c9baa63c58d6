#include "tools/http_tls.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <utility>

#include "common/tls_files.h"
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>

namespace idem::http_tls {
namespace {

Status Bad(const std::string& place, const std::string& problem) {
  return Status::InvalidArgument(place + ": " + problem);
}

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (base_dir.empty() || path.empty() || path[0] == '/') return path;
  return base_dir + "/" + path;
}

Status PathField(const Json& t, const char* field, const std::string& place,
                 const std::string& base_dir, std::string* out) {
  auto it = t.find(field);
  if (it == t.end()) return Status::Ok();
  if (!it->is_string() || it->get<std::string>().empty()) {
    return Bad(place + "." + field, "expected a file path");
  }
  *out = Resolve(base_dir, it->get<std::string>());
  return Status::Ok();
}

// Fatal alerts a server sends while it checks the handshake (RFC 8446 6.2),
// before it reads any request: OpenSSL queues a received alert with the
// reason SSL_AD_REASON_OFFSET + its code.
constexpr std::array<int, 9> kRefusalAlerts = {
    SSL_AD_HANDSHAKE_FAILURE,   SSL_AD_BAD_CERTIFICATE,     SSL_AD_UNSUPPORTED_CERTIFICATE,
    SSL_AD_CERTIFICATE_REVOKED, SSL_AD_CERTIFICATE_EXPIRED, SSL_AD_CERTIFICATE_UNKNOWN,
    SSL_AD_UNKNOWN_CA,          SSL_AD_ACCESS_DENIED,       SSL_AD_CERTIFICATE_REQUIRED,
};

// This thread's OpenSSL error queue, drained: the reason of a refusal alert
// in it ("" if none) and the reason of its last error ("" if empty).
struct Queued {
  std::string alert;
  std::string last;
};
Queued DrainErrors() {
  Queued q;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    const char* text = ERR_reason_error_string(e);
    q.last = text != nullptr ? text : "OpenSSL error " + std::to_string(e);
    for (int alert : kRefusalAlerts) {
      if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_AD_REASON_OFFSET + alert) {
        q.alert = q.last;
      }
    }
  }
  return q;
}

}  // namespace

Status ParseFields(const Json& t, const std::string& place, const std::string& base_dir,
                   HttpToolConfig* c) {
  IDEM_RETURN_IF_ERROR(PathField(t, "ca_file", place, base_dir, &c->ca_file));
  IDEM_RETURN_IF_ERROR(PathField(t, "client_cert", place, base_dir, &c->client_cert));
  IDEM_RETURN_IF_ERROR(PathField(t, "client_key", place, base_dir, &c->client_key));
  const bool any = !c->ca_file.empty() || !c->client_cert.empty() || !c->client_key.empty();
  if (any && !c->tls) {
    const char* field = !c->ca_file.empty()       ? "ca_file"
                        : !c->client_cert.empty() ? "client_cert"
                                                  : "client_key";
    return Bad(place + "." + field, "only allowed with an https:// base_url");
  }
  if (c->client_cert.empty() != c->client_key.empty()) {
    return Bad(place + (c->client_cert.empty() ? ".client_cert" : ".client_key"),
               "client_cert and client_key go together (mutual TLS needs both)");
  }
  if (!c->ca_file.empty())
    IDEM_RETURN_IF_ERROR(CheckCertificateFile(c->ca_file, place + ".ca_file"));
  if (!c->client_cert.empty()) {
    IDEM_RETURN_IF_ERROR(CheckCertificateAndKey(c->client_cert, place + ".client_cert",
                                                c->client_key, place + ".client_key"));
  }
  return Status::Ok();
}

namespace {

// The Client::Watch of a context (ex_data; one context per Client).
int WatchIndex() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

Client::Watch* WatchOf(const SSL* ssl) {
  return static_cast<Client::Watch*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), WatchIndex()));
}

// Notes the client's ClientHello (a handshake in this exchange) and a
// CertificateRequest from the server.
void OnMessage(int write_p, int /*version*/, int content_type, const void* buf, size_t len,
               SSL* /*ssl*/, void* arg) {
  auto* watch = static_cast<Client::Watch*>(arg);
  if (content_type != SSL3_RT_HANDSHAKE || len == 0) return;
  const unsigned char type = static_cast<const unsigned char*>(buf)[0];
  if (write_p != 0 && type == SSL3_MT_CLIENT_HELLO) watch->hello_sent = true;
  if (write_p == 0 && type == SSL3_MT_CERTIFICATE_REQUEST) watch->certificate_requested = true;
}

// At the end of the client's side of a TLS 1.3 handshake in which the server
// asked for a certificate: waits for the server's next word and notes
// whether it closed the connection (its refusal) before any request left.
void OnInfo(const SSL* ssl, int where, int /*ret*/) {
  if ((where & SSL_CB_HANDSHAKE_DONE) == 0 || SSL_is_server(const_cast<SSL*>(ssl)) != 0) return;
  Client::Watch* watch = WatchOf(ssl);
  if (watch == nullptr || watch->waited || !watch->certificate_requested ||
      SSL_version(ssl) != TLS1_3_VERSION) {
    return;
  }
  watch->waited = true;
  pollfd p{SSL_get_fd(ssl), POLLIN | POLLRDHUP, 0};
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(watch->wait_ms);
  int64_t left = watch->wait_ms;
  while (left > 0) {
    p.revents = 0;
    int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) {
      left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                   std::chrono::steady_clock::now())
                 .count();
      continue;
    }
    if (n <= 0) return;  // nothing within the wait: go on
    if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      watch->closed_after_handshake = true;
      return;
    }
    // Data: session tickets, or an alert whose close is on its way. Give
    // the close a moment, watching for it alone.
    p.events = POLLRDHUP;
    left = std::min<int64_t>(50, left);
    p.revents = 0;
    if (::poll(&p, 1, static_cast<int>(left)) > 0 &&
        (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      watch->closed_after_handshake = true;
    }
    return;
  }
}

}  // namespace

Client::Client(const HttpToolConfig& config) : config_(config) {
  if (!config.tls) {
    cli_ = std::make_unique<httplib::ClientImpl>(config.host, config.port);
    return;
  }
  auto cli = std::make_unique<httplib::SSLClient>(config.host, config.port, config.client_cert,
                                                  config.client_key);
  if (SSL_CTX* ctx = cli->ssl_context(); ctx != nullptr) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    watch_.wait_ms = std::min<int64_t>(config.connect_timeout_ms, 1000);
    SSL_CTX_set_ex_data(ctx, WatchIndex(), &watch_);
    SSL_CTX_set_msg_callback(ctx, OnMessage);
    SSL_CTX_set_msg_callback_arg(ctx, &watch_);
    SSL_CTX_set_info_callback(ctx, OnInfo);
  }
  cli->enable_server_certificate_verification(true);
  // No ca_file: the system store (SSL_CTX_set_default_verify_paths).
  if (!config.ca_file.empty()) cli->set_ca_cert_path(config.ca_file);
  cli_ = std::move(cli);
}

Client::~Client() = default;

void Client::BeginExchange() {
  watch_.hello_sent = false;
  watch_.certificate_requested = false;
  watch_.waited = false;
  watch_.closed_after_handshake = false;
}

Failure Client::Classify(httplib::Error error) {
  const HttpToolConfig& c = config_;
  httplib::ClientImpl& cli = *cli_;
  Failure f;
  if (!c.tls) return f;
  const std::string peer = (c.host.find(':') != std::string::npos ? "[" + c.host + "]" : c.host) +
                           ":" + std::to_string(c.port);
  auto& ssl = static_cast<httplib::SSLClient&>(cli);
  switch (error) {
    case httplib::Error::SSLServerVerification: {
      f.tls = f.refused = f.not_sent = true;
      const long v = ssl.get_openssl_verify_result();
      f.reason = "the TLS certificate of " + peer + " is not trusted: " +
                 (v != X509_V_OK ? std::string(X509_verify_cert_error_string(v))
                                 : "it does not name the host " + c.host);
      if (v == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
          v == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
          v == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT) {
        f.reason += c.ca_file.empty() ? " (not in the system CA store; name its CA in \"ca_file\")"
                                      : " (not signed by the CA of " + c.ca_file + ")";
      }
      break;
    }
    case httplib::Error::SSLLoadingCerts:
      f.tls = f.refused = f.not_sent = true;
      f.reason = "cannot load the CA certificates" +
                 (c.ca_file.empty() ? std::string(" of the system store") : " of " + c.ca_file);
      break;
    case httplib::Error::SSLConnection: {
      f.tls = f.not_sent = true;
      Queued q = DrainErrors();
      f.refused = !q.alert.empty();
      f.reason = "the TLS handshake with " + peer + " failed: " +
                 (!q.alert.empty()  ? q.alert + " (the server refused the connection)"
                  : !q.last.empty() ? q.last
                                    : "the connection closed or timed out");
      break;
    }
    case httplib::Error::Read:
    case httplib::Error::Write: {
      // On a connection kept from an earlier exchange the request may have
      // been read: unknown, whatever the alert.
      if (!watch_.hello_sent) break;
      // TLS 1.3: the client's side of the handshake ends before the server
      // checks the client's certificate, so its refusal arrives as the
      // first read (or write) fails. The server has not read the request.
      Queued q = DrainErrors();
      if (!q.alert.empty()) {
        f.tls = f.refused = f.not_sent = true;
        f.reason = "the TLS handshake with " + peer + " was refused by the server: " + q.alert;
      } else if (watch_.closed_after_handshake) {
        f.tls = f.refused = f.not_sent = true;
        f.reason = "the TLS handshake with " + peer +
                   " was refused by the server: it asked for a client certificate and closed "
                   "the connection before the request was sent (" +
                   (c.client_cert.empty() ? std::string("none is configured: set "
                                                        "\"client_cert\" and \"client_key\"")
                                          : "it did not accept " + c.client_cert) +
                   ")";
      }
      break;
    }
    default:
      break;
  }
  ERR_clear_error();
  return f;
}

}  // namespace idem::http_tls
