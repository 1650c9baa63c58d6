#pragma once
// Commit tokens: the signed handle between a step's preview and its commit.
//
// A two-phase write step is previewed, then committed with a token that
// TokenSigner minted for exactly that (saga, step, argument fingerprint) and
// a bounded lifetime. The same token is what a person approves.
//
// Token text (ASCII, at most kMaxTokenBytes):
//
//   idem1.<base64url(payload)>.<base64url(mac)>
//
// base64url is RFC 4648 section 5 without padding, decoded strictly: only the
// 64 alphabet characters, no '=', unused trailing bits zero, so each payload
// has exactly one text. mac = HMAC-SHA256(secret of key_id, signing input),
// where the signing input is the token text before the last '.', that is
// "idem1." + base64url(payload): the version prefix and the payload.
//
// payload, all integers big-endian, every string prefixed by its length in
// one byte:
//
//   u8 version (=1) | u8 len, key_id | u8 len, saga_id | u8 len, step_id |
//   u8 len, args_fingerprint | i64 issued_at_ms | i64 expires_at_ms |
//   16 bytes nonce
//
// and nothing after the nonce. Tokens are signed, not encrypted: whoever
// holds one can read its claims. A token is a bearer capability; single use
// is the store's job: it records the nonce (TokenClaims::nonce, the "jti")
// in the same transaction that marks the step submitted.
//
// Errors (the HTTP layer maps each class to one status):
//   - kInvalidArgument, kInvalidTokenMessage: anything forged, tampered,
//     malformed, oversized, signed by an unknown, other or retired key. One
//     message and one code for all, so a caller cannot probe which part was
//     wrong. The MAC is checked (CRYPTO_memcmp) before any claim other than
//     the key id is read.
//   - kFailedPrecondition, kExpiredTokenMessage: genuine but expired
//     (now >= expires_at_ms). kNotYetValidTokenMessage: genuine, but issued
//     more than max_clock_skew_ms after now (the clock went back).
//   - kFailedPrecondition, kMismatchedTokenMessage: genuine, but minted for
//     another saga, step or argument fingerprint.
// The last three are reported only after the MAC verified.
//
// Thread safety: KeyRing and TokenSigner are safe to use from many threads;
// Rotate and Retire may run while others Mint and Verify.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace idem::preview_commit {

/// The one message of every refused token that did not authenticate.
inline constexpr std::string_view kInvalidTokenMessage = "invalid commit token";
/// The message of a genuine token whose lifetime is over.
inline constexpr std::string_view kExpiredTokenMessage = "commit token expired";
/// The message of a genuine token issued in the future of this clock.
inline constexpr std::string_view kNotYetValidTokenMessage = "commit token not yet valid";
/// The message of a genuine token presented for another saga, step or args.
inline constexpr std::string_view kMismatchedTokenMessage = "commit token does not match this step";

/// Longest token text accepted; longer input is refused before any work.
inline constexpr size_t kMaxTokenBytes = 1024;
/// Longest key id (characters [A-Za-z0-9_-]).
inline constexpr size_t kMaxKeyIdBytes = 32;
/// Longest saga id, step id and argument fingerprint, in bytes each.
inline constexpr size_t kMaxBoundFieldBytes = 200;
/// Bytes of a signing secret.
inline constexpr size_t kSecretBytes = 32;
/// Bytes of a MAC (HMAC-SHA256).
inline constexpr size_t kMacBytes = 32;

/// What a token says. Meaningful only when returned by Open or Verify.
struct TokenClaims {
  int version = 1;
  std::string key_id;            ///< the key that signed it
  std::string saga_id;           ///< binding
  std::string step_id;           ///< binding
  std::string args_fingerprint;  ///< binding, e.g. "sha256:..."
  int64_t issued_at_ms = 0;      ///< Clock::NowMs() at Mint
  int64_t expires_at_ms = 0;     ///< first instant at which it no longer verifies
  std::string nonce;             ///< 128 random bits, 32 lower-case hex; the jti
};

/// Public facts about one key (never its secret).
struct KeyInfo {
  std::string key_id;
  int64_t created_at_ms = 0;
  bool retired = false;
  bool active = false;
};

/// Signing secrets by key id. One key is active (signs new tokens); every
/// other key that is not retired still verifies, so tokens minted before a
/// rotation stay usable until their key is retired.
///
/// A file-backed ring (LoadOrCreate) persists every change; its file is JSON:
///   {"version": 1, "active": "k2",
///    "keys": {"k1": {"secret": "<base64, 32 bytes>", "created_at_ms": ...,
///                    "retired": false}, ...}}
/// readable and writable by its owner only (mode 0600). Changes are written
/// to a fresh 0600 temporary file, fsync'ed and renamed over the old one
/// (then the directory is fsync'ed), under an exclusive flock on
/// "<path>.lock" and after re-reading the file, so that two processes that
/// rotate do not lose each other's keys. A ring made by ForTesting lives in
/// memory only.
///
/// Errors of LoadOrCreate/Rotate/Retire: kFailedPrecondition for a keyring
/// file that is unsafe (group/other permission bits, another owner, a
/// symlink, not a regular file) or corrupt; kNotFound for Retire of an
/// unknown key; kInternal for a failed system call or random source.
class KeyRing {
 public:
  /// Loads the keyring at `path`, or creates it with one fresh key when the
  /// file does not exist. `clock` stamps created_at_ms and must outlive the
  /// ring.
  static Result<KeyRing> LoadOrCreate(const std::string& path, Clock* clock);

  /// An in-memory ring with the given secrets (key id -> raw bytes, any
  /// non-empty length) and active key. Asserts that `active` is among them.
  static KeyRing ForTesting(const std::map<std::string, std::string>& secrets,
                            const std::string& active, Clock* clock = nullptr);

  KeyRing(KeyRing&&) noexcept;
  KeyRing& operator=(KeyRing&&) noexcept;
  KeyRing(const KeyRing&) = delete;
  KeyRing& operator=(const KeyRing&) = delete;
  ~KeyRing();  ///< wipes the secrets from memory

  /// Adds a fresh key ("k<N+1>") and makes it active; the previous active key
  /// keeps verifying. Returns the new key id.
  Result<std::string> Rotate();

  /// Retires a key: tokens it signed no longer verify. Retiring a retired key
  /// is OK; the active key cannot be retired (kFailedPrecondition: rotate
  /// first).
  Status Retire(const std::string& key_id);

  /// Re-reads the file, to pick up a rotation or retirement made by another
  /// process (e.g. `idem keys retire` while a server runs). On error the
  /// ring keeps its keys. A no-op for an in-memory ring.
  Status Reload();

  /// The key that signs new tokens.
  std::string active_key_id() const;
  /// Every key, in key-id order.
  std::vector<KeyInfo> keys() const;
  /// The file, or "" for an in-memory ring.
  const std::string& path() const;

 private:
  friend class TokenSigner;
  struct Impl;
  explicit KeyRing(std::unique_ptr<Impl> impl);

  /// HMAC-SHA256 of `data` under `key_id` into `mac`. Returns false, after
  /// doing the same work with a dummy key, when the key is unknown or retired.
  bool Mac(const std::string& key_id, std::string_view data,
           std::array<unsigned char, kMacBytes>* mac) const;

  std::unique_ptr<Impl> impl_;
};

/// Limits applied by TokenSigner.
struct TokenOptions {
  /// Longest lifetime Mint accepts.
  int64_t max_ttl_ms = 7LL * 24 * 3600 * 1000;
  /// How far issued_at_ms may lie in the future of the verifier's clock.
  int64_t max_clock_skew_ms = 60'000;
};

/// Mints and checks commit tokens with the keys of a KeyRing. Holds
/// pointers only: `keys` and `clock` must outlive it.
class TokenSigner {
 public:
  TokenSigner(const KeyRing* keys, Clock* clock, TokenOptions options = {});

  /// Mints a token bound to (saga_id, step_id, args_fingerprint), valid for
  /// `ttl_ms` from now, signed with the active key. kInvalidArgument for an
  /// empty or over-long field or a ttl outside (0, max_ttl_ms]; kInternal if
  /// the random source fails. Fills `claims_out` when given.
  Result<std::string> Mint(const std::string& saga_id, const std::string& step_id,
                           const std::string& args_fingerprint, int64_t ttl_ms,
                           TokenClaims* claims_out = nullptr) const;

  /// Open, then checks the binding: the token must have been minted for
  /// exactly this saga, step and argument fingerprint.
  Result<TokenClaims> Verify(const std::string& token, const std::string& saga_id,
                             const std::string& step_id, const std::string& args_fingerprint) const;

  /// Checks the format, MAC, key, version and lifetime, and returns the
  /// claims; the caller checks the binding (e.g. `approve TOKEN`, which
  /// looks the step up by the claims).
  Result<TokenClaims> Open(const std::string& token) const;

 private:
  const KeyRing* keys_;
  Clock* clock_;
  TokenOptions options_;
};

}  // namespace idem::preview_commit
