#include "common/tls_files.h"

#include <cstdio>
#include <memory>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

namespace idem {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

std::string Where(const std::string& path, const std::string& place) {
  return place.empty() ? path : place + ": " + path;
}

// Opens a regular file for reading; `what` names it in errors.
Result<File> Open(const std::string& path, const std::string& place, const char* what) {
  if (path.empty()) return Status::InvalidArgument(place + ": the path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::NotFound(Where(path, place) + ": cannot read the " + what + " (no such file)");
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(Where(path, place) + ": the " + what + " is not a regular file");
  }
  File f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return Status::NotFound(Where(path, place) + ": cannot read the " + what +
                            " (permission denied?)");
  }
  return f;
}

// No passphrase: an encrypted key is refused rather than prompting.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return -1; }

}  // namespace

std::string LastOpenSslError() {
  unsigned long e = ERR_peek_last_error();
  if (e == 0) return "";
  const char* reason = ERR_reason_error_string(e);
  if (reason != nullptr) return reason;
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

Status CheckCertificateFile(const std::string& path, const std::string& place) {
  Result<File> f = Open(path, place, "certificate file");
  if (!f.ok()) return f.status();
  ERR_clear_error();
  X509* cert = PEM_read_X509(f->get(), nullptr, NoPassphrase, nullptr);
  ERR_clear_error();
  if (cert == nullptr) {
    return Status::InvalidArgument(Where(path, place) + ": no PEM certificate in the file");
  }
  X509_free(cert);
  return Status::Ok();
}

Status CheckPrivateKeyFile(const std::string& path, const std::string& place) {
  Result<File> f = Open(path, place, "private key file");
  if (!f.ok()) return f.status();
  struct stat st {};
  if (::fstat(fileno(f->get()), &st) == 0 &&
      (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0) {
    return Status::FailedPrecondition(Where(path, place) +
                                      ": the private key file is readable or writable by group "
                                      "or others; chmod 600 it");
  }
  ERR_clear_error();
  EVP_PKEY* key = PEM_read_PrivateKey(f->get(), nullptr, NoPassphrase, nullptr);
  ERR_clear_error();
  if (key == nullptr) {
    return Status::InvalidArgument(Where(path, place) +
                                   ": no unencrypted PEM private key in the file");
  }
  EVP_PKEY_free(key);
  return Status::Ok();
}

Status CheckCertificateAndKey(const std::string& cert_path, const std::string& cert_place,
                              const std::string& key_path, const std::string& key_place) {
  IDEM_RETURN_IF_ERROR(CheckCertificateFile(cert_path, cert_place));
  IDEM_RETURN_IF_ERROR(CheckPrivateKeyFile(key_path, key_place));
  Result<File> cf = Open(cert_path, cert_place, "certificate file");
  Result<File> kf = Open(key_path, key_place, "private key file");
  if (!cf.ok()) return cf.status();
  if (!kf.ok()) return kf.status();
  X509* cert = PEM_read_X509(cf->get(), nullptr, NoPassphrase, nullptr);
  EVP_PKEY* key = PEM_read_PrivateKey(kf->get(), nullptr, NoPassphrase, nullptr);
  const bool match = cert != nullptr && key != nullptr && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  if (!match) {
    return Status::InvalidArgument(Where(key_path, key_place) +
                                   ": the private key does not belong to the certificate " +
                                   cert_path);
  }
  return Status::Ok();
}

}  // namespace idem
