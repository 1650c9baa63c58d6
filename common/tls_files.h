#pragma once
// Checks of TLS certificate and private-key files (PEM), made where they are
// configured (a tools file, `idem serve --tls-cert/--tls-key`, the example
// providers), so that a bad path fails at load with a message that names the
// place instead of failing the first handshake.
//
// A private key must be readable by its owner only: a key file that group or
// others may read (or write) is refused, as the auth file is. No function
// here puts a file's content in a message: a bad key is named by its path.
//
// Thread safety: free functions; safe from any thread.

#include <string>

#include "common/status.h"

namespace idem {

/// `path` holds at least one PEM certificate. `place` starts every message
/// (`tools[0].ca_file: certs/ca.pem: no PEM certificate in the file`).
/// kNotFound when the file cannot be read, kInvalidArgument when it holds
/// no certificate.
Status CheckCertificateFile(const std::string& path, const std::string& place);

/// `path` is a regular file readable by its owner only that holds an
/// unencrypted PEM private key. kNotFound when it cannot be read,
/// kFailedPrecondition when group or others may read or write it,
/// kInvalidArgument when it holds no usable key.
Status CheckPrivateKeyFile(const std::string& path, const std::string& place);

/// Both files pass the checks above and the key belongs to the first
/// certificate of `cert_path` (kInvalidArgument naming `key_place` if not).
Status CheckCertificateAndKey(const std::string& cert_path, const std::string& cert_place,
                              const std::string& key_path, const std::string& key_place);

/// The reason OpenSSL gives for the last error queued on this thread
/// ("certificate verify failed", "tlsv13 alert certificate required"), or
/// "" when none is queued. Does not clear the queue.
std::string LastOpenSslError();

}  // namespace idem
