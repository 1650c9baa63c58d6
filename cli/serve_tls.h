#pragma once
// `idem serve --tls-cert PATH --tls-key PATH`: the checks of the two flags,
// made before anything starts, so that a bad flag is a usage error (exit 2)
// that names the flag.
//
// Thread safety: a free function.

#include <string>

#include "common/status.h"

namespace idem::cli {

/// Both flags or neither (neither: plain HTTP); the certificate a PEM
/// certificate, the key an unencrypted PEM key of that certificate that
/// group and others may not read (common/tls_files.h). Every message starts
/// with the flag: `--tls-key server.key: the private key file is readable
/// ...`. Never names a key's content.
Status CheckServeTls(const std::string& cert_path, const std::string& key_path);

}  // namespace idem::cli
