#include "cli/serve_tls.h"

#include "common/tls_files.h"

namespace idem::cli {

Status CheckServeTls(const std::string& cert_path, const std::string& key_path) {
  if (cert_path.empty() && key_path.empty()) return Status::Ok();
  if (cert_path.empty()) {
    return Status::InvalidArgument("--tls-key needs --tls-cert (both or neither)");
  }
  if (key_path.empty()) {
    return Status::InvalidArgument("--tls-cert needs --tls-key (both or neither)");
  }
  return CheckCertificateAndKey(cert_path, "--tls-cert", key_path, "--tls-key");
}

}  // namespace idem::cli
