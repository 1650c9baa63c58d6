#pragma once
// HTTPS for HTTP tools (internal to tools/http_tool.cc): the TLS fields of a
// tools entry, the client that speaks to an https:// base_url, and what a
// TLS failure means for the call.
//
//   "base_url":    "https://payments.example:8443/api"   (port default 443)
//   "ca_file":     "certs/ca.pem"        PEM CA certificates to trust instead
//                                        of the system store (optional)
//   "client_cert": "certs/client.pem"    mutual TLS: a PEM certificate chain
//   "client_key":  "certs/client.key"    and its unencrypted PEM key (0600);
//                                        both or neither
//
// The server's certificate is always verified, chain and host name (the
// host of base_url, DNS name or IP address in its subjectAltName): there is
// no field that turns verification off. A provider with a self-signed
// certificate is trusted by naming that certificate as its "ca_file".
// Relative paths are taken from the directory of the tools file (from the
// working directory for an inline document). The fields are only allowed
// with an https base_url. Every file is checked when the tools file is
// loaded (present, PEM, the key owner-only and matching the certificate);
// no message ever holds a key's content.
//
// A TLS failure is classified by what provably happened (see
// docs/architecture.md, "HTTPS for HTTP tools"):
//   the server's certificate fails verification   failed, not retryable; the
//     (unknown CA, expired, wrong host name)      request was not sent
//   the server sends a fatal handshake alert     failed, not retryable; the
//     (certificate required, bad certificate,     server refused the
//     unknown CA, access denied, handshake        connection before reading
//     failure)                                    any request
//   TLS 1.3, the server asked for a client       failed, not retryable: the
//     certificate and closed the connection      server refused the client
//     right after the handshake, before the      certificate and cannot have
//     request was written                        read the request
//   the handshake is cut or times out with no    failed, retryable: nothing
//     alert                                       was sent
//
// Why the TLS 1.3 row needs a wait: the client's side of a TLS 1.3 handshake
// ends before the server has checked the client's certificate, so a refusal
// would only show once the request is on its way (as a failed write or
// read, "unknown"). When the server asked for a certificate, the client
// therefore waits, after its last handshake message and before the request,
// for the server's next word (its session tickets, or the close that
// follows an alert), at most min(connect_timeout_ms, 1 s).
//
// Thread safety: free functions; a client is used by one thread at a time.

#include <cstdint>
#include <memory>
#include <string>

#include <httplib.h>

#include "tools/http_tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::http_tls {

/// Reads "ca_file", "client_cert" and "client_key" of the tools entry `t`
/// at `place` (tools[2]) into `c`, resolving relative paths against
/// `base_dir` ("" = as given), and checks the files. kInvalidArgument
/// naming the field (`tools[2].client_key: ...`); kNotFound for a file that
/// cannot be read; kFailedPrecondition for a key others may read.
Status ParseFields(const Json& t, const std::string& place, const std::string& base_dir,
                   HttpToolConfig* c);

/// What a TLS failure means for the call.
struct Failure {
  bool tls = false;       ///< the exchange failed in TLS (the fields below are set)
  bool refused = false;   ///< verification failed or the server refused: do not retry
  bool not_sent = false;  ///< the provider cannot have acted on the request
  std::string reason;     ///< "the TLS handshake with 127.0.0.1:8443 failed: ..."
};

/// The client of `config` (an SSLClient for https): one connection, kept
/// open between exchanges while the server keeps it (tools/http_tool.cc
/// pools them), and what the handshake of the current exchange showed. Not
/// copyable or movable (the TLS callbacks point at it).
class Client {
 public:
  explicit Client(const HttpToolConfig& config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// The client; timeouts are the caller's to set.
  httplib::ClientImpl& get() { return *cli_; }

  /// Forgets what the previous exchange's handshake showed: call before
  /// each send. An exchange on a connection kept from an earlier one has
  /// no handshake of its own.
  void BeginExchange();

  /// Classifies the exchange that just failed with `error`. Call it on the
  /// sending thread right after send, the OpenSSL error queue cleared before
  /// send; drains that queue. `tls` is false for plain HTTP or a failure
  /// that is not a TLS one. A failed read or write is read as the server's
  /// refusal of the handshake only when this exchange made one: on a kept
  /// connection the request may have been read, so it stays unknown.
  Failure Classify(httplib::Error error);

  /// What the TLS callbacks saw (public for them; not an interface).
  struct Watch {
    int64_t wait_ms = 0;      ///< the wait after a TLS 1.3 handshake
    bool hello_sent = false;  ///< this exchange began a handshake (its ClientHello)
    bool certificate_requested = false;
    bool waited = false;
    bool closed_after_handshake = false;
  };

 private:
  const HttpToolConfig& config_;
  std::unique_ptr<httplib::ClientImpl> cli_;
  Watch watch_;
};

}  // namespace idem::http_tls
