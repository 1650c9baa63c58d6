#include "preview_commit/token.h"

#include <array>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "common/json_util.h"
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem::preview_commit {
namespace {

constexpr std::string_view kPrefix = "idem1.";
constexpr int kVersion = 1;
constexpr size_t kMacTextBytes = 43;  // base64url of 32 bytes, unpadded
constexpr size_t kNonceBytes = 16;
constexpr int kKeyringFormat = 1;
constexpr off_t kMaxKeyringFileBytes = 1 << 20;

// The longest token Mint can make fits the limit Open enforces:
// payload 1 + (1 + 32) + 3 * (1 + 200) + 8 + 8 + 16 = 669 bytes, 892 in text.
static_assert(kPrefix.size() +
                      (1 + 1 + kMaxKeyIdBytes + 3 * (1 + kMaxBoundFieldBytes) + 8 + 8 +
                       kNonceBytes + 2) /
                          3 * 4 +
                      1 + kMacTextBytes <=
                  kMaxTokenBytes,
              "the longest token must fit kMaxTokenBytes");

Status InvalidToken() { return Status::InvalidArgument(std::string(kInvalidTokenMessage)); }

// ---- base64 (RFC 4648), strict

constexpr std::string_view kUrlAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
constexpr std::string_view kStdAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string EncodeBase64(std::string_view data, std::string_view alphabet, bool pad) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(data[i]) << 16) | (static_cast<uint8_t>(data[i + 1]) << 8) |
                 static_cast<uint8_t>(data[i + 2]);
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(alphabet[(v >> 6) & 63]);
    out.push_back(alphabet[v & 63]);
  }
  size_t rest = data.size() - i;
  if (rest == 1) {
    uint32_t v = static_cast<uint8_t>(data[i]) << 16;
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    if (pad) out += "==";
  } else if (rest == 2) {
    uint32_t v = (static_cast<uint8_t>(data[i]) << 16) | (static_cast<uint8_t>(data[i + 1]) << 8);
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(alphabet[(v >> 6) & 63]);
    if (pad) out += "=";
  }
  return out;
}

// Decodes `text` and accepts it only if it is the one canonical encoding of
// the result (alphabet, padding and unused bits exactly as EncodeBase64
// writes them), so that no two texts decode to the same bytes.
bool DecodeBase64(std::string_view text, std::string_view alphabet, bool pad, std::string* out) {
  std::array<int, 256> value{};
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<uint8_t>(alphabet[i])] = i;
  std::string_view body = text;
  if (pad) {
    if (text.size() % 4 != 0) return false;
    while (!body.empty() && body.back() == '=' && text.size() - body.size() < 2) {
      body.remove_suffix(1);
    }
  }
  if (body.size() % 4 == 1) return false;
  std::string bytes;
  bytes.reserve(body.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : body) {
    int v = value[static_cast<uint8_t>(c)];
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (EncodeBase64(bytes, alphabet, pad) != text) return false;
  *out = std::move(bytes);
  return true;
}

std::string Hex(std::string_view bytes) {
  constexpr std::string_view kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    out.push_back(kHex[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kHex[static_cast<uint8_t>(c) & 0xf]);
  }
  return out;
}

bool ValidKeyId(std::string_view id) {
  if (id.empty() || id.size() > kMaxKeyIdBytes) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// ---- payload encoding

void PutString(std::string* out, const std::string& s) {
  assert(s.size() <= 255);
  out->push_back(static_cast<char>(static_cast<uint8_t>(s.size())));
  out->append(s);
}

void PutI64(std::string* out, int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int shift = 56; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((u >> shift) & 0xff));
  }
}

// Reads the payload front to back; any read past the end clears ok.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool ok() const { return ok_; }
  bool AtEnd() const { return pos_ == data_.size(); }

  uint8_t U8() {
    std::string_view b = Bytes(1);
    return b.empty() ? 0 : static_cast<uint8_t>(b[0]);
  }
  std::string String() { return std::string(Bytes(U8())); }
  int64_t I64() {
    std::string_view b = Bytes(8);
    uint64_t u = 0;
    for (char c : b) u = (u << 8) | static_cast<uint8_t>(c);
    return static_cast<int64_t>(u);
  }
  std::string_view Bytes(size_t n) {
    if (!ok_ || data_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    std::string_view b = data_.substr(pos_, n);
    pos_ += n;
    return b;
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

std::string EncodePayload(const TokenClaims& c, std::string_view nonce_bytes) {
  std::string p;
  p.push_back(static_cast<char>(c.version));
  PutString(&p, c.key_id);
  PutString(&p, c.saga_id);
  PutString(&p, c.step_id);
  PutString(&p, c.args_fingerprint);
  PutI64(&p, c.issued_at_ms);
  PutI64(&p, c.expires_at_ms);
  p.append(nonce_bytes);
  return p;
}

bool BoundFieldOk(const std::string& s) { return !s.empty() && s.size() <= kMaxBoundFieldBytes; }

// ---- keyring file

struct Key {
  std::string secret;
  int64_t created_at_ms = 0;
  bool retired = false;

  Key() = default;
  Key(std::string s, int64_t at, bool r) : secret(std::move(s)), created_at_ms(at), retired(r) {}
  Key(const Key&) = default;
  Key(Key&&) noexcept = default;
  Key& operator=(const Key&) = default;
  Key& operator=(Key&&) noexcept = default;
  ~Key() { OPENSSL_cleanse(secret.data(), secret.size()); }  // best effort
};

struct State {
  std::map<std::string, Key> keys;
  std::string active;
};

// Wipes a buffer that held secret material (best effort) when it goes away.
struct Wiped {
  std::string text;
  Wiped() = default;
  Wiped(const Wiped&) = delete;
  Wiped& operator=(const Wiped&) = delete;
  Wiped(Wiped&&) = delete;
  Wiped& operator=(Wiped&&) = delete;
  ~Wiped() { OPENSSL_cleanse(text.data(), text.size()); }
};

Status SysError(const std::string& path, const char* what) {
  return Status::Internal("keyring " + path + ": " + what + ": " + std::strerror(errno));
}

Status Corrupt(const std::string& path, const std::string& why) {
  return Status::FailedPrecondition("keyring " + path + " is corrupt: " + why);
}

// Closes a descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&&) = delete;
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

Result<Key> NewKey(Clock* clock) {
  std::array<unsigned char, kSecretBytes> bytes{};
  if (RAND_priv_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return Status::Internal("keyring: the random source failed");
  }
  Key key(std::string(reinterpret_cast<char*>(bytes.data()), bytes.size()),
          clock ? clock->NowMs() : 0, false);
  OPENSSL_cleanse(bytes.data(), bytes.size());
  return key;
}

Status ParseState(const std::string& path, const std::string& text, State* out) {
  auto parsed = ParseJson(text, "keyring " + path, 8);
  if (!parsed.ok()) return Status::FailedPrecondition(parsed.status().message());
  const Json& doc = *parsed;
  if (!doc.is_object() || doc.size() != 3 || !doc.contains("version") || !doc.contains("active") ||
      !doc.contains("keys")) {
    return Corrupt(path, "expected exactly the fields version, active, keys");
  }
  if (!doc["version"].is_number_integer() || doc["version"].get<int64_t>() != kKeyringFormat) {
    return Corrupt(path, "version must be 1");
  }
  if (!doc["keys"].is_object() || doc["keys"].empty()) return Corrupt(path, "keys must list keys");
  State st;
  for (const auto& [id, entry] : doc["keys"].items()) {
    std::string where = "keys." + PrintableText(id);
    if (!ValidKeyId(id)) return Corrupt(path, where + ": bad key id");
    if (!entry.is_object() || entry.size() != 3 || !entry.contains("secret") ||
        !entry.contains("created_at_ms") || !entry.contains("retired")) {
      return Corrupt(path, where + ": expected exactly the fields secret, created_at_ms, retired");
    }
    const Json& secret = entry["secret"];
    Key key;
    if (!secret.is_string() ||
        !DecodeBase64(secret.get_ref<const std::string&>(), kStdAlphabet, true, &key.secret) ||
        key.secret.size() != kSecretBytes) {
      return Corrupt(path, where + ".secret: expected base64 of 32 bytes");
    }
    if (!entry["created_at_ms"].is_number_integer()) {
      return Corrupt(path, where + ".created_at_ms: expected an integer");
    }
    if (!entry["retired"].is_boolean())
      return Corrupt(path, where + ".retired: expected a boolean");
    key.created_at_ms = entry["created_at_ms"].get<int64_t>();
    key.retired = entry["retired"].get<bool>();
    st.keys.emplace(id, std::move(key));
  }
  if (!doc["active"].is_string()) return Corrupt(path, "active: expected a key id");
  st.active = doc["active"].get<std::string>();
  auto it = st.keys.find(st.active);
  if (it == st.keys.end()) return Corrupt(path, "active: not among keys");
  if (it->second.retired) return Corrupt(path, "active: the active key is retired");
  *out = std::move(st);
  return Status::Ok();
}

std::string SerializeState(const State& st) {
  Json keys = Json::object();
  for (const auto& [id, key] : st.keys) {
    keys[id] = Json{{"secret", EncodeBase64(key.secret, kStdAlphabet, true)},
                    {"created_at_ms", key.created_at_ms},
                    {"retired", key.retired}};
  }
  Json doc{{"version", kKeyringFormat}, {"active", st.active}, {"keys", std::move(keys)}};
  return doc.dump(2) + "\n";
}

// Reads and checks the file. kNotFound when it does not exist.
Status LoadState(const std::string& path, State* out) {
  // O_NONBLOCK: a FIFO planted at `path` must not block the open.
  int raw = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (raw < 0) {
    if (errno == ENOENT) return Status::NotFound("keyring " + path + " does not exist");
    if (errno == ELOOP) return Status::FailedPrecondition("keyring " + path + " is a symlink");
    return SysError(path, "open");
  }
  Fd fd(raw);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return SysError(path, "fstat");
  if (!S_ISREG(st.st_mode)) {
    return Status::FailedPrecondition("keyring " + path + " is not a regular file");
  }
  if (st.st_uid != ::geteuid()) {
    return Status::FailedPrecondition("keyring " + path + " is owned by uid " +
                                      std::to_string(st.st_uid) + ", not by this user");
  }
  if ((st.st_mode & 077) != 0) {
    std::array<char, 8> mode{};
    std::snprintf(mode.data(), mode.size(), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::FailedPrecondition("keyring " + path + " has mode " + mode.data() +
                                      "; it must be accessible by its owner only (chmod 600)");
  }
  if (st.st_size > kMaxKeyringFileBytes) {
    return Status::FailedPrecondition("keyring " + path + " is larger than 1 MiB");
  }
  Wiped text;
  std::array<char, 4096> buf{};
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SysError(path, "read");
    if (n == 0) break;
    text.text.append(buf.data(), static_cast<size_t>(n));
    if (text.text.size() > static_cast<size_t>(kMaxKeyringFileBytes)) {
      return Status::FailedPrecondition("keyring " + path + " is larger than 1 MiB");
    }
  }
  OPENSSL_cleanse(buf.data(), buf.size());
  return ParseState(path, text.text, out);
}

std::string DirName(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

enum class WriteMode { kCreateNew, kReplace };

// Writes the state to a fresh 0600 temporary file beside `path`, fsyncs it,
// and then either links it to `path` only if `path` does not exist
// (kCreateNew; kConflict if it does) or renames it over `path` (kReplace).
// Readers see the old file or the new one, never a partial one.
Status WriteState(const std::string& path, const State& state, WriteMode mode) {
  Wiped text;
  text.text = SerializeState(state);
  std::string tmp = path + ".tmp." + NewId("");
  int raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (raw < 0) return SysError(tmp, "create");
  Fd fd(raw);
  auto fail = [&](const char* what) {
    Status s = SysError(tmp, what);
    ::unlink(tmp.c_str());
    return s;
  };
  // The umask may only have narrowed 0600; set it exactly anyway.
  if (::fchmod(fd.get(), 0600) != 0) return fail("fchmod");
  size_t done = 0;
  while (done < text.text.size()) {
    ssize_t n = ::write(fd.get(), text.text.data() + done, text.text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync");
  if (::close(fd.Release()) != 0) return fail("close");
  if (mode == WriteMode::kCreateNew) {
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      if (err == EEXIST) return Status::Conflict("keyring " + path + " already exists");
      errno = err;
      return SysError(path, "link");
    }
    ::unlink(tmp.c_str());
  } else if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail("rename");
  }
  std::string dir = DirName(path);
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return SysError(dir, "open directory");
  if (::fsync(dfd.get()) != 0) return SysError(dir, "fsync directory");
  return Status::Ok();
}

// "k<N+1>" for the largest N among keys named "k<N>".
std::string NextKeyId(const State& st) {
  uint64_t max = 0;
  for (const auto& [id, key] : st.keys) {
    (void)key;
    if (id.size() < 2 || id.size() > 19 || id[0] != 'k') continue;
    uint64_t n = 0;
    bool digits = true;
    for (size_t i = 1; i < id.size(); ++i) {
      if (id[i] < '0' || id[i] > '9') {
        digits = false;
        break;
      }
      n = n * 10 + static_cast<uint64_t>(id[i] - '0');
    }
    if (digits && n > max) max = n;
  }
  std::string id = "k" + std::to_string(max + 1);
  while (st.keys.count(id) != 0) id += "_";  // only with hand-made names
  return id;
}

}  // namespace

// ---- KeyRing

struct KeyRing::Impl {
  std::string path;  // "" for an in-memory ring
  Clock* clock = nullptr;
  std::mutex write_mu;           // serializes Rotate and Retire
  mutable std::shared_mutex mu;  // guards state
  State state;
};

KeyRing::KeyRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KeyRing::KeyRing(KeyRing&&) noexcept = default;
KeyRing& KeyRing::operator=(KeyRing&&) noexcept = default;
KeyRing::~KeyRing() = default;

Result<KeyRing> KeyRing::LoadOrCreate(const std::string& path, Clock* clock) {
  assert(clock != nullptr);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->clock = clock;
  Status s = LoadState(path, &impl->state);
  if (s.code() == Code::kNotFound) {
    State fresh;
    auto key = NewKey(clock);
    if (!key.ok()) return key.status();
    fresh.active = "k1";
    fresh.keys.emplace("k1", std::move(key).value());
    s = WriteState(path, fresh, WriteMode::kCreateNew);
    if (s.ok()) {
      impl->state = std::move(fresh);
    } else if (s.code() == Code::kConflict) {  // another process created it first
      s = LoadState(path, &impl->state);
    }
  }
  if (!s.ok()) return s;
  return KeyRing(std::move(impl));
}

KeyRing KeyRing::ForTesting(const std::map<std::string, std::string>& secrets,
                            const std::string& active, Clock* clock) {
  auto impl = std::make_unique<Impl>();
  impl->clock = clock;
  for (const auto& [id, secret] : secrets) {
    assert(ValidKeyId(id) && !secret.empty());
    impl->state.keys.emplace(id, Key(secret, clock ? clock->NowMs() : 0, false));
  }
  assert(impl->state.keys.count(active) == 1);
  impl->state.active = active;
  return KeyRing(std::move(impl));
}

namespace {

// Applies `change` to the newest state (re-read from the file under an flock
// for a file-backed ring), persists it, and then publishes it.
Status Mutate(const std::string& path, std::shared_mutex* mu, State* current,
              const std::function<Status(State*)>& change) {
  State next;
  std::optional<Fd> lock;
  if (path.empty()) {
    std::shared_lock<std::shared_mutex> read(*mu);
    next = *current;
  } else {
    std::string lock_path = path + ".lock";
    lock.emplace(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (lock->get() < 0) return SysError(lock_path, "open");
    while (::flock(lock->get(), LOCK_EX) != 0) {
      if (errno != EINTR) return SysError(lock_path, "flock");
    }
    IDEM_RETURN_IF_ERROR(LoadState(path, &next));
  }
  IDEM_RETURN_IF_ERROR(change(&next));
  if (!path.empty()) IDEM_RETURN_IF_ERROR(WriteState(path, next, WriteMode::kReplace));
  std::unique_lock<std::shared_mutex> write(*mu);
  *current = std::move(next);
  return Status::Ok();  // the flock is released when `lock` closes
}

}  // namespace

Result<std::string> KeyRing::Rotate() {
  std::lock_guard<std::mutex> guard(impl_->write_mu);
  std::string new_id;
  Status s = Mutate(impl_->path, &impl_->mu, &impl_->state, [&](State* st) -> Status {
    auto key = NewKey(impl_->clock);
    if (!key.ok()) return key.status();
    new_id = NextKeyId(*st);
    st->keys.emplace(new_id, std::move(key).value());
    st->active = new_id;
    return Status::Ok();
  });
  if (!s.ok()) return s;
  return new_id;
}

Status KeyRing::Retire(const std::string& key_id) {
  std::lock_guard<std::mutex> guard(impl_->write_mu);
  return Mutate(impl_->path, &impl_->mu, &impl_->state, [&](State* st) -> Status {
    auto it = st->keys.find(key_id);
    if (it == st->keys.end()) {
      return Status::NotFound("keyring: no key \"" + PrintableText(key_id) + "\"");
    }
    if (st->active == key_id) {
      return Status::FailedPrecondition("keyring: \"" + key_id +
                                        "\" is the active key; rotate before retiring it");
    }
    it->second.retired = true;
    return Status::Ok();
  });
}

Status KeyRing::Reload() {
  if (impl_->path.empty()) return Status::Ok();
  State fresh;
  IDEM_RETURN_IF_ERROR(LoadState(impl_->path, &fresh));
  std::unique_lock<std::shared_mutex> write(impl_->mu);
  impl_->state = std::move(fresh);
  return Status::Ok();
}

std::string KeyRing::active_key_id() const {
  std::shared_lock<std::shared_mutex> read(impl_->mu);
  return impl_->state.active;
}

std::vector<KeyInfo> KeyRing::keys() const {
  std::shared_lock<std::shared_mutex> read(impl_->mu);
  std::vector<KeyInfo> out;
  for (const auto& [id, key] : impl_->state.keys) {
    out.push_back({id, key.created_at_ms, key.retired, id == impl_->state.active});
  }
  return out;
}

const std::string& KeyRing::path() const { return impl_->path; }

bool KeyRing::Mac(const std::string& key_id, std::string_view data,
                  std::array<unsigned char, kMacBytes>* mac) const {
  static constexpr std::array<unsigned char, kSecretBytes> kDummyKey{};
  std::shared_lock<std::shared_mutex> read(impl_->mu);
  auto it = impl_->state.keys.find(key_id);
  bool usable = it != impl_->state.keys.end() && !it->second.retired;
  const void* key = usable ? static_cast<const void*>(it->second.secret.data()) : kDummyKey.data();
  int key_len =
      usable ? static_cast<int>(it->second.secret.size()) : static_cast<int>(kSecretBytes);
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key, key_len, reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), mac->data(), &mac_len) == nullptr ||
      mac_len != kMacBytes) {
    throw std::runtime_error("HMAC-SHA256 failed");  // a broken OpenSSL
  }
  return usable;
}

// ---- TokenSigner

TokenSigner::TokenSigner(const KeyRing* keys, Clock* clock, TokenOptions options)
    : keys_(keys), clock_(clock), options_(options) {
  assert(keys_ != nullptr && clock_ != nullptr);
}

Result<std::string> TokenSigner::Mint(const std::string& saga_id, const std::string& step_id,
                                      const std::string& args_fingerprint, int64_t ttl_ms,
                                      TokenClaims* claims_out) const {
  const std::array<std::pair<const char*, const std::string*>, 3> fields = {
      {{"saga id", &saga_id}, {"step id", &step_id}, {"args fingerprint", &args_fingerprint}}};
  for (const auto& [name, value] : fields) {
    if (!BoundFieldOk(*value)) {
      return Status::InvalidArgument(std::string("commit token: ") + name + " must be 1 to " +
                                     std::to_string(kMaxBoundFieldBytes) + " bytes, got " +
                                     std::to_string(value->size()));
    }
  }
  if (ttl_ms <= 0 || ttl_ms > options_.max_ttl_ms) {
    return Status::InvalidArgument("commit token: ttl " + std::to_string(ttl_ms) +
                                   " ms is outside (0, " + std::to_string(options_.max_ttl_ms) +
                                   "]");
  }
  int64_t now = clock_->NowMs();
  if (now > std::numeric_limits<int64_t>::max() - ttl_ms) {
    return Status::InvalidArgument("commit token: expiry overflows");
  }
  std::array<unsigned char, kNonceBytes> nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return Status::Internal("commit token: the random source failed");
  }
  std::string_view nonce_bytes(reinterpret_cast<const char*>(nonce.data()), nonce.size());

  TokenClaims claims;
  claims.version = kVersion;
  claims.saga_id = saga_id;
  claims.step_id = step_id;
  claims.args_fingerprint = args_fingerprint;
  claims.issued_at_ms = now;
  claims.expires_at_ms = now + ttl_ms;
  claims.nonce = Hex(nonce_bytes);
  // The active key can be rotated and then retired between reading its id
  // and signing; then sign again with the new active key.
  for (int attempt = 0; attempt < 3; ++attempt) {
    claims.key_id = keys_->active_key_id();
    std::string signing_input(kPrefix);
    signing_input += EncodeBase64(EncodePayload(claims, nonce_bytes), kUrlAlphabet, false);
    std::array<unsigned char, kMacBytes> mac{};
    if (!keys_->Mac(claims.key_id, signing_input, &mac)) continue;
    std::string token =
        signing_input + "." +
        EncodeBase64(std::string_view(reinterpret_cast<const char*>(mac.data()), mac.size()),
                     kUrlAlphabet, false);
    assert(token.size() <= kMaxTokenBytes);
    if (claims_out != nullptr) *claims_out = claims;
    return token;
  }
  return Status::Aborted("commit token: signing keys changed while minting; retry");
}

Result<TokenClaims> TokenSigner::Open(const std::string& token) const {
  // Structure first (nothing here depends on a secret or on claim content).
  if (token.size() > kMaxTokenBytes || token.compare(0, kPrefix.size(), kPrefix) != 0) {
    return InvalidToken();
  }
  size_t dot = token.find('.', kPrefix.size());
  if (dot == std::string::npos || token.size() - dot - 1 != kMacTextBytes) return InvalidToken();
  std::string_view text(token);
  std::string_view signing_input = text.substr(0, dot);
  std::string payload;
  std::string mac;
  if (!DecodeBase64(text.substr(kPrefix.size(), dot - kPrefix.size()), kUrlAlphabet, false,
                    &payload) ||
      !DecodeBase64(text.substr(dot + 1), kUrlAlphabet, false, &mac) || mac.size() != kMacBytes) {
    return InvalidToken();
  }

  // The key id is the one claim read before the MAC: it names the key.
  // An unknown or retired key costs the same HMAC (with a dummy key).
  if (payload.size() < 2 || payload.size() - 2 < static_cast<uint8_t>(payload[1])) {
    return InvalidToken();
  }
  std::string key_id = payload.substr(2, static_cast<uint8_t>(payload[1]));
  std::array<unsigned char, kMacBytes> expected{};
  bool key_ok = keys_->Mac(key_id, signing_input, &expected);
  bool mac_ok = CRYPTO_memcmp(expected.data(), mac.data(), kMacBytes) == 0;
  if (!(key_ok && mac_ok)) return InvalidToken();

  // Authentic: now parse every claim, strictly.
  Reader r(payload);
  TokenClaims c;
  c.version = r.U8();
  c.key_id = r.String();
  c.saga_id = r.String();
  c.step_id = r.String();
  c.args_fingerprint = r.String();
  c.issued_at_ms = r.I64();
  c.expires_at_ms = r.I64();
  c.nonce = Hex(r.Bytes(kNonceBytes));
  // (The key id was read above from the same bytes, and named a key.)
  if (!r.ok() || !r.AtEnd() || c.version != kVersion || !BoundFieldOk(c.saga_id) ||
      !BoundFieldOk(c.step_id) || !BoundFieldOk(c.args_fingerprint) ||
      c.expires_at_ms <= c.issued_at_ms) {
    return InvalidToken();
  }
  int64_t now = clock_->NowMs();
  if (now >= c.expires_at_ms) return Status::FailedPrecondition(std::string(kExpiredTokenMessage));
  if (c.issued_at_ms > now && static_cast<uint64_t>(c.issued_at_ms) - static_cast<uint64_t>(now) >
                                  static_cast<uint64_t>(options_.max_clock_skew_ms)) {
    return Status::FailedPrecondition(std::string(kNotYetValidTokenMessage));
  }
  return c;
}

Result<TokenClaims> TokenSigner::Verify(const std::string& token, const std::string& saga_id,
                                        const std::string& step_id,
                                        const std::string& args_fingerprint) const {
  auto claims = Open(token);
  if (!claims.ok()) return claims;
  if (claims->saga_id != saga_id || claims->step_id != step_id ||
      claims->args_fingerprint != args_fingerprint) {
    return Status::FailedPrecondition(std::string(kMismatchedTokenMessage));
  }
  return claims;
}

}  // namespace idem::preview_commit
