// Commit tokens (RELIABILITY.md section 2, rows 13-15 and 18; the store does
// row 16's single use). Bad tokens are counted: every test that throws them
// at the signer prints "bad tokens: N tried, 0 accepted", and the run ends
// with the total.

#include "preview_commit/token.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include "common/clock.h"
#include "common/json_util.h"
#include "common/status.h"
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem::preview_commit {
namespace {

// ---- helpers written independently of token.cc, to check its format

constexpr std::string_view kUrl =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string B64Url(const std::string& in) {
  auto byte = [&](size_t i) { return i < in.size() ? static_cast<uint8_t>(in[i]) : 0u; };
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    size_t chars = std::min<size_t>(4, (in.size() - i) * 8 / 6 + 1);  // 2, 3 or 4
    for (size_t k = 0; k < chars; ++k) out.push_back(kUrl[(v >> (18 - 6 * k)) & 63]);
  }
  return out;
}

std::string UnB64Url(const std::string& in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    acc = (acc << 6) | static_cast<uint32_t>(kUrl.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string HmacSha256(const std::string& key, const std::string& data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac.data(), &len);
  return {reinterpret_cast<char*>(mac.data()), len};
}

struct Parts {
  std::string payload_text;
  std::string mac_text;
};

Parts Split(const std::string& token) {
  size_t a = token.find('.');
  size_t b = token.find('.', a + 1);
  return {token.substr(a + 1, b - a - 1), token.substr(b + 1)};
}

// Builds a payload as token.h documents it.
struct RawPayload {
  int version = 1;
  std::string key_id = "k1";
  std::string saga_id = "sg_0001";
  std::string step_id = "book_flight";
  std::string args_fingerprint = "sha256:00ff";
  int64_t issued_at_ms = 0;
  int64_t expires_at_ms = 0;
  std::string nonce = std::string(16, '\x5a');
  std::string trailer;

  std::string Encode() const {
    std::string p(1, static_cast<char>(version));
    for (const std::string* s : {&key_id, &saga_id, &step_id, &args_fingerprint}) {
      p.push_back(static_cast<char>(s->size()));
      p += *s;
    }
    for (int64_t v : {issued_at_ms, expires_at_ms}) {
      for (int shift = 56; shift >= 0; shift -= 8) {
        p.push_back(static_cast<char>((static_cast<uint64_t>(v) >> shift) & 0xff));
      }
    }
    return p + nonce + trailer;
  }
};

std::string SignRaw(const std::string& secret, const std::string& payload,
                    const std::string& prefix = "idem1.") {
  std::string input = prefix + B64Url(payload);
  return "idem1." + B64Url(payload) + "." + B64Url(HmacSha256(secret, input));
}

bool IsUniformInvalid(const Status& s) {
  return s.code() == Code::kInvalidArgument && s.message() == kInvalidTokenMessage;
}

// ---- bad-token bookkeeping

std::atomic<int64_t> g_tried{0};
std::atomic<int64_t> g_accepted{0};

class TotalsPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("all token tests: bad tokens: %lld tried, %lld accepted\n",
                static_cast<long long>(g_tried.load()), static_cast<long long>(g_accepted.load()));
  }
};
[[maybe_unused]] ::testing::Environment* const kTotals =
    ::testing::AddGlobalTestEnvironment(new TotalsPrinter);

// Counts bad tokens, how many were accepted, and how many were refused with
// anything but the uniform error.
class Tally {
 public:
  void Refused(const Result<TokenClaims>& r, const std::string& token) {
    ++tried_;
    if (r.ok()) {
      if (accepted_++ == 0) first_accepted_ = token;
    } else if (!IsUniformInvalid(r.status())) {
      if (non_uniform_++ == 0) first_non_uniform_ = token + " -> " + r.status().ToString();
    }
  }

  // Prints the counts and checks them; `at_least` guards against a loop that
  // did not run.
  void Report(const std::string& what, int64_t at_least) {
    std::printf("%s: bad tokens: %lld tried, %lld accepted\n", what.c_str(),
                static_cast<long long>(tried_), static_cast<long long>(accepted_));
    g_tried += tried_;
    g_accepted += accepted_;
    EXPECT_GE(tried_, at_least);
    EXPECT_EQ(accepted_, 0) << "first accepted: " << PrintableText(first_accepted_);
    EXPECT_EQ(non_uniform_, 0) << "first non-uniform: " << PrintableText(first_non_uniform_);
  }

 private:
  int64_t tried_ = 0;
  int64_t accepted_ = 0;
  int64_t non_uniform_ = 0;
  std::string first_accepted_;
  std::string first_non_uniform_;
};

const std::string kSecretA(32, 'A');
const std::string kSecretB(32, 'B');
const std::string kFp = "sha256:" + std::string(64, 'c');

class TokenTest : public ::testing::Test {
 protected:
  std::string MintOk(const std::string& saga = "sg_0001", const std::string& step = "book_flight",
                     const std::string& fp = kFp, int64_t ttl_ms = 60'000) {
    auto t = signer_.Mint(saga, step, fp, ttl_ms);
    EXPECT_OK(t);
    return t.ok() ? *t : std::string();
  }
  Result<TokenClaims> VerifyDefault(const std::string& token) {
    return signer_.Verify(token, "sg_0001", "book_flight", kFp);
  }

  ManualClock clock_{1'700'000'000'000};
  KeyRing ring_ = KeyRing::ForTesting({{"k1", kSecretA}}, "k1", &clock_);
  TokenSigner signer_{&ring_, &clock_};
};

// ---- round trip and format

TEST_F(TokenTest, RoundTrip) {
  TokenClaims minted;
  auto token = signer_.Mint("sg_0001", "book_flight", kFp, 60'000, &minted);
  ASSERT_OK(token);
  EXPECT_EQ(token->rfind("idem1.", 0), 0u) << *token;
  EXPECT_LE(token->size(), kMaxTokenBytes);
  EXPECT_EQ(token->find_first_not_of(std::string(kUrl) + "."), std::string::npos) << *token;

  auto claims = VerifyDefault(*token);
  ASSERT_OK(claims);
  EXPECT_EQ(claims->version, 1);
  EXPECT_EQ(claims->key_id, "k1");
  EXPECT_EQ(claims->saga_id, "sg_0001");
  EXPECT_EQ(claims->step_id, "book_flight");
  EXPECT_EQ(claims->args_fingerprint, kFp);
  EXPECT_EQ(claims->issued_at_ms, 1'700'000'000'000);
  EXPECT_EQ(claims->expires_at_ms, 1'700'000'060'000);
  EXPECT_EQ(claims->nonce.size(), 32u);
  EXPECT_EQ(claims->nonce.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(minted.nonce, claims->nonce);
  EXPECT_EQ(minted.expires_at_ms, claims->expires_at_ms);
  EXPECT_EQ(minted.key_id, claims->key_id);

  auto opened = signer_.Open(*token);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->nonce, claims->nonce);

  // Two mints for the same step differ (fresh nonce: the store's jti).
  TokenClaims again;
  auto token2 = signer_.Mint("sg_0001", "book_flight", kFp, 60'000, &again);
  ASSERT_OK(token2);
  EXPECT_NE(*token2, *token);
  EXPECT_NE(again.nonce, minted.nonce);
}

TEST_F(TokenTest, FormatIsTheDocumentedOne) {
  std::string token = MintOk();
  Parts parts = Split(token);
  ASSERT_EQ(parts.mac_text.size(), 43u);
  std::string payload = UnB64Url(parts.payload_text);
  RawPayload expected;
  expected.args_fingerprint = kFp;
  expected.issued_at_ms = clock_.NowMs();
  expected.expires_at_ms = clock_.NowMs() + 60'000;
  ASSERT_EQ(payload.size(), expected.Encode().size());
  expected.nonce = payload.substr(payload.size() - 16);
  EXPECT_EQ(payload, expected.Encode());
  // The MAC covers the version prefix and the payload text.
  EXPECT_EQ(UnB64Url(parts.mac_text), HmacSha256(kSecretA, "idem1." + parts.payload_text));
}

// ---- forged and tampered (row 14)

TEST_F(TokenTest, EveryBitFlipOfTheTokenTextIsRefused) {
  std::string token = MintOk();
  Tally tally;
  for (size_t i = 0; i < token.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = token;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      tally.Refused(VerifyDefault(bad), bad);
    }
  }
  tally.Report("text bit flips", static_cast<int64_t>(token.size()) * 8);
  EXPECT_OK(VerifyDefault(token));  // the original still verifies
}

TEST_F(TokenTest, EveryBitFlipOfEveryPayloadFieldAndOfTheMacIsRefused) {
  std::string token = MintOk();
  Parts parts = Split(token);
  std::string payload = UnB64Url(parts.payload_text);
  std::string mac = UnB64Url(parts.mac_text);
  ASSERT_EQ("idem1." + B64Url(payload) + "." + B64Url(mac), token);  // the helpers round-trip
  Tally tally;
  for (size_t i = 0; i < payload.size(); ++i) {  // version, kid, saga, step, fp, iat, exp, nonce
    for (int bit = 0; bit < 8; ++bit) {
      std::string p = payload;
      p[i] = static_cast<char>(p[i] ^ (1 << bit));
      std::string bad = "idem1." + B64Url(p) + "." + B64Url(mac);
      tally.Refused(VerifyDefault(bad), bad);
    }
  }
  for (size_t i = 0; i < mac.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string m = mac;
      m[i] = static_cast<char>(m[i] ^ (1 << bit));
      std::string bad = "idem1." + B64Url(payload) + "." + B64Url(m);
      tally.Refused(VerifyDefault(bad), bad);
    }
  }
  tally.Report("decoded bit flips", static_cast<int64_t>(payload.size() + mac.size()) * 8);
}

TEST_F(TokenTest, TruncatedAtEveryLengthIsRefused) {
  std::string token = MintOk();
  Tally tally;
  for (size_t len = 0; len < token.size(); ++len) {
    std::string bad = token.substr(0, len);
    tally.Refused(VerifyDefault(bad), bad);
    tally.Refused(signer_.Open(bad), bad);
  }
  tally.Report("truncations", static_cast<int64_t>(token.size()) * 2);
}

TEST_F(TokenTest, EmptyIsRefused) {
  EXPECT_TRUE(IsUniformInvalid(VerifyDefault("").status()));
  EXPECT_TRUE(IsUniformInvalid(signer_.Open("").status()));
}

TEST_F(TokenTest, WrongVersionPrefixAndStrayCharactersAreRefused) {
  std::string token = MintOk();
  std::string rest = token.substr(6);
  Tally tally;
  for (const std::string& bad : {
           "idem2." + rest, "idem0." + rest, "IDEM1." + rest, "idem." + rest, "idem11." + rest,
           "xidem1." + rest, " idem1." + rest, "idem1.." + rest, "idem1" + rest, rest, token + "\n",
           token + ".", token + "=", token + "A", "idem1." + rest + "." + rest,
           token.substr(0, token.size() - 1) + "=",  // padding instead of the last char
           token.substr(0, token.size() - 1) + "+",  // standard base64 alphabet
           SignRaw(kSecretA, UnB64Url(Split(token).payload_text), "idem2."),  // MAC over idem2.
       }) {
    tally.Refused(VerifyDefault(bad), bad);
  }
  tally.Report("prefix and stray characters", 18);
}

TEST_F(TokenTest, OversizedTokensAreRefusedAndTheLongestMintableFits) {
  Tally tally;
  std::string token = MintOk();
  for (size_t size : {kMaxTokenBytes + 1, size_t{4096}, size_t{1} << 20}) {
    std::string bad = token + std::string(size - token.size(), 'A');
    tally.Refused(VerifyDefault(bad), bad.substr(0, 64));
  }
  tally.Report("oversized", 3);

  std::string long_kid(kMaxKeyIdBytes, 'K');
  KeyRing ring = KeyRing::ForTesting({{long_kid, kSecretA}}, long_kid, &clock_);
  TokenSigner signer(&ring, &clock_);
  std::string saga(kMaxBoundFieldBytes, 's'), step(kMaxBoundFieldBytes, 't');
  std::string fp(kMaxBoundFieldBytes, 'f');
  auto longest = signer.Mint(saga, step, fp, 60'000);
  ASSERT_OK(longest);
  EXPECT_LE(longest->size(), kMaxTokenBytes);
  EXPECT_OK(signer.Verify(*longest, saga, step, fp));
}

// Tokens MAC'ed with the real key but not minted by Mint: parsing after the
// MAC is strict too. The first case is a control: the forging helper works.
TEST_F(TokenTest, ResignedMalformedPayloadsAreRefused) {
  RawPayload good;
  good.issued_at_ms = clock_.NowMs();
  good.expires_at_ms = clock_.NowMs() + 60'000;
  auto control = signer_.Verify(SignRaw(kSecretA, good.Encode()), good.saga_id, good.step_id,
                                good.args_fingerprint);
  ASSERT_OK(control);
  EXPECT_EQ(control->nonce, "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a");

  std::vector<RawPayload> bad(8, good);
  bad[0].trailer = "x";                             // bytes after the nonce
  bad[1].version = 2;                               // unknown version
  bad[2].expires_at_ms = good.issued_at_ms;         // no lifetime
  bad[3].saga_id = "";                              // empty binding
  bad[4].nonce = std::string(15, 'n');              // short nonce
  bad[5].args_fingerprint = std::string(201, 'f');  // over the field limit
  bad[6].step_id = "";
  bad[7].expires_at_ms = good.issued_at_ms - 1;
  Tally tally;
  for (const RawPayload& p : bad) {
    std::string t = SignRaw(kSecretA, p.Encode());
    tally.Refused(signer_.Open(t), t);
  }
  // MAC over the raw payload instead of the signing input.
  std::string raw_mac =
      "idem1." + B64Url(good.Encode()) + "." + B64Url(HmacSha256(kSecretA, good.Encode()));
  tally.Refused(signer_.Open(raw_mac), raw_mac);
  tally.Report("re-signed malformed payloads", 9);
}

TEST_F(TokenTest, UnknownKeyIdIsRefused) {
  std::string token = MintOk();  // signed by k1
  // Same secret under another id: the key id is part of what is signed.
  KeyRing other = KeyRing::ForTesting({{"k2", kSecretA}}, "k2", &clock_);
  TokenSigner other_signer(&other, &clock_);
  Tally tally;
  tally.Refused(other_signer.Verify(token, "sg_0001", "book_flight", kFp), token);
  tally.Refused(other_signer.Open(token), token);
  // A hand-made payload naming a key the ring does not have.
  RawPayload p;
  p.key_id = "k7";
  p.args_fingerprint = kFp;
  p.issued_at_ms = clock_.NowMs();
  p.expires_at_ms = clock_.NowMs() + 1000;
  std::string forged = SignRaw(kSecretA, p.Encode());
  tally.Refused(VerifyDefault(forged), forged);
  tally.Report("unknown key id", 3);
}

TEST_F(TokenTest, TokenSignedWithAnotherKeyIsRefused) {
  KeyRing other = KeyRing::ForTesting({{"k1", kSecretB}}, "k1", &clock_);  // same id
  TokenSigner other_signer(&other, &clock_);
  auto theirs = other_signer.Mint("sg_0001", "book_flight", kFp, 60'000);
  ASSERT_OK(theirs);
  ASSERT_OK(other_signer.Verify(*theirs, "sg_0001", "book_flight", kFp));  // control
  std::string ours = MintOk();
  Tally tally;
  tally.Refused(VerifyDefault(*theirs), *theirs);
  tally.Refused(other_signer.Verify(ours, "sg_0001", "book_flight", kFp), ours);
  tally.Report("other key", 2);
}

// ---- rotation (row 18)

TEST_F(TokenTest, OldKeyVerifiesAfterRotationUntilRetired) {
  std::string old_token = MintOk();
  auto k2 = ring_.Rotate();
  ASSERT_OK(k2);
  EXPECT_EQ(*k2, "k2");
  EXPECT_EQ(ring_.active_key_id(), "k2");

  auto old_claims = VerifyDefault(old_token);
  ASSERT_OK(old_claims);
  EXPECT_EQ(old_claims->key_id, "k1");
  TokenClaims new_claims;
  auto new_token = signer_.Mint("sg_0001", "book_flight", kFp, 60'000, &new_claims);
  ASSERT_OK(new_token);
  EXPECT_EQ(new_claims.key_id, "k2");

  Status s = ring_.Retire("k2");
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();  // the active key
  EXPECT_EQ(ring_.Retire("k9").code(), Code::kNotFound);
  ASSERT_OK(ring_.Retire("k1"));
  EXPECT_OK(ring_.Retire("k1"));  // again: no change

  Tally tally;
  tally.Refused(VerifyDefault(old_token), old_token);
  tally.Refused(signer_.Open(old_token), old_token);
  tally.Report("retired key", 2);
  EXPECT_OK(VerifyDefault(*new_token));

  auto keys = ring_.keys();
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].key_id, "k1");
  EXPECT_TRUE(keys[0].retired);
  EXPECT_FALSE(keys[0].active);
  EXPECT_TRUE(keys[1].active);
  EXPECT_FALSE(keys[1].retired);
}

// ---- lifetime (row 13)

TEST_F(TokenTest, ExpiresExactlyAtExpiry) {
  TokenClaims claims;
  auto token = signer_.Mint("sg_0001", "book_flight", kFp, 60'000, &claims);
  ASSERT_OK(token);
  clock_.AdvanceMs(claims.expires_at_ms - 1 - clock_.NowMs());
  EXPECT_TRUE(VerifyDefault(*token).ok()) << "exp-1 must be accepted";
  for (int64_t step : {1, 1, 999}) {  // exp, exp+1, exp+1000
    clock_.AdvanceMs(step);
    auto r = VerifyDefault(*token);
    ASSERT_FALSE(r.ok()) << "accepted at exp+" << clock_.NowMs() - claims.expires_at_ms;
    EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(r.status().message(), kExpiredTokenMessage);
    EXPECT_EQ(signer_.Open(*token).status().message(), kExpiredTokenMessage);
  }
  // An expired token that is also forged reports the forgery: MAC first.
  std::string bad = *token;
  bad.back() = bad.back() == 'A' ? 'B' : 'A';
  EXPECT_TRUE(IsUniformInvalid(VerifyDefault(bad).status()));
}

TEST_F(TokenTest, NotYetValidWhenTheClockWentBackPastTheSkew) {
  std::string token = MintOk();
  clock_.AdvanceMs(-60'000);  // exactly the allowed skew
  EXPECT_OK(VerifyDefault(token));
  clock_.AdvanceMs(-1);
  auto r = VerifyDefault(token);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), kNotYetValidTokenMessage);
}

// ---- binding (row 15)

TEST_F(TokenTest, TokenOutsideItsBindingIsRefused) {
  std::string token = MintOk("sg_0001", "book_flight", kFp);
  ASSERT_OK(VerifyDefault(token));  // control
  struct Case {
    const char* what;
    std::string saga, step, fp;
  };
  for (const Case& c : {
           Case{"another step", "sg_0001", "book_hotel", kFp},
           Case{"another saga", "sg_0002", "book_flight", kFp},
           Case{"changed args", "sg_0001", "book_flight", "sha256:" + std::string(64, 'd')},
           Case{"empty step", "sg_0001", "", kFp},
       }) {
    auto r = signer_.Verify(token, c.saga, c.step, c.fp);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << c.what;
    EXPECT_EQ(r.status().message(), kMismatchedTokenMessage) << c.what;
  }
  // Open does not check the binding; it returns it.
  auto opened = signer_.Open(token);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->step_id, "book_flight");
  // Tampered and mismatched: the forgery is what is reported.
  std::string bad = token;
  bad[10] = bad[10] == 'A' ? 'B' : 'A';
  EXPECT_TRUE(IsUniformInvalid(signer_.Verify(bad, "sg_0002", "x", kFp).status()));
}

TEST_F(TokenTest, MintRefusesBadInput) {
  std::string too_long(kMaxBoundFieldBytes + 1, 'x');
  struct Case {
    std::string saga, step, fp;
    int64_t ttl;
  };
  for (const Case& c : {
           Case{"", "s", kFp, 1000},
           Case{"g", "", kFp, 1000},
           Case{"g", "s", "", 1000},
           Case{too_long, "s", kFp, 1000},
           Case{"g", too_long, kFp, 1000},
           Case{"g", "s", too_long, 1000},
           Case{"g", "s", kFp, 0},
           Case{"g", "s", kFp, -5},
           Case{"g", "s", kFp, TokenOptions{}.max_ttl_ms + 1},
       }) {
    auto r = signer_.Mint(c.saga, c.step, c.fp, c.ttl);
    ASSERT_FALSE(r.ok()) << c.saga.size() << " " << c.step.size() << " " << c.ttl;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message(), kInvalidTokenMessage);
  }
  EXPECT_OK(signer_.Mint("g", "s", kFp, TokenOptions{}.max_ttl_ms));
}

// ---- fuzz (row 14: ~10^4 fuzzed tokens)

uint64_t SeedFromEnvOrRandom() {
  if (const char* s = std::getenv("IDEM_SEED")) return std::strtoull(s, nullptr, 0);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

TEST_F(TokenTest, RandomTokensAreNeverAccepted) {
  const uint64_t seed = SeedFromEnvOrRandom();
  std::printf("seed: %llu (replay with IDEM_SEED=%llu)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto below = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xff);
    return s;
  };
  auto random_url_text = [&](size_t n) {
    std::string s(n, 'A');
    for (char& c : s) c = kUrl[below(64)];
    return s;
  };
  const std::string genuine_payload = Split(MintOk()).payload_text;
  constexpr int kEach = 10'000;
  Tally tally;
  for (int i = 0; i < kEach; ++i) {  // random bytes, sometimes with the right prefix
    std::string bad = random_bytes(below(1100));
    if (i % 2 == 0) bad = "idem1." + bad;
    tally.Refused(VerifyDefault(bad), bad);
  }
  for (int i = 0; i < kEach; ++i) {  // well-formed looking: idem1.<b64url>.<43 b64url>
    std::string bad = "idem1." + random_url_text(below(900)) + "." + random_url_text(43);
    tally.Refused(VerifyDefault(bad), bad);
  }
  for (int i = 0; i < kEach; ++i) {  // a genuine payload with a random (canonical) MAC
    std::string bad = "idem1." + genuine_payload + "." + B64Url(random_bytes(32));
    tally.Refused(VerifyDefault(bad), bad);
  }
  for (int i = 0; i < kEach; ++i) {  // structured payloads for k1 with random claims, random MAC
    RawPayload p;
    p.saga_id = random_url_text(1 + below(30));
    p.issued_at_ms = clock_.NowMs();
    p.expires_at_ms = clock_.NowMs() + 1 + static_cast<int64_t>(below(100'000));
    p.nonce = random_bytes(16);
    std::string bad = "idem1." + B64Url(p.Encode()) + "." + B64Url(random_bytes(32));
    tally.Refused(signer_.Open(bad), bad);
  }
  tally.Report("random tokens", int64_t{4} * kEach);
}

// ---- concurrency: rotation while minting and verifying

TEST_F(TokenTest, RotationWhileMintingAndVerifying) {
  std::atomic<int> failures{0};
  std::atomic<int> verified{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        auto token = signer_.Mint("sg_0001", "book_flight", kFp, 60'000);
        if (!token.ok() || !VerifyDefault(*token).ok()) {
          ++failures;
        } else {
          ++verified;
        }
      }
    });
  }
  for (int i = 0; i < 20; ++i) ASSERT_OK(ring_.Rotate());
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(verified.load(), 4 * 300);
  EXPECT_EQ(ring_.active_key_id(), "k21");
}

// ---- the keyring file

class KeyRingFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.path();
    path_ = dir_ + "/keys.json";
  }

  static int Mode(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return static_cast<int>(st.st_mode & 07777);
  }
  void WriteFile(const std::string& text) {
    std::ofstream(path_, std::ios::trunc) << text;
    ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  }
  std::vector<std::string> DirEntries() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  ManualClock clock_{1'700'000'000'000};
  test::TempDir tmp_{"idem_keyring"};
  std::string dir_;
  std::string path_;
};

TEST_F(KeyRingFileTest, CreatesTheFileWithMode0600WhateverTheUmask) {
  mode_t old = ::umask(0);  // would leave 0666 bits if the code relied on the umask
  auto ring = KeyRing::LoadOrCreate(path_, &clock_);
  ::umask(old);
  ASSERT_OK(ring);
  EXPECT_EQ(Mode(path_), 0600);
  EXPECT_EQ(ring->active_key_id(), "k1");
  EXPECT_EQ(ring->path(), path_);
  auto keys = ring->keys();
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0].created_at_ms, 1'700'000'000'000);
  auto doc = ParseJson(test::ReadFile(path_), "keys.json");
  ASSERT_OK(doc);
  EXPECT_EQ((*doc)["active"], "k1");
  EXPECT_EQ((*doc)["keys"]["k1"]["secret"].get<std::string>().size(), 44u);  // base64 of 32 bytes
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"keys.json"});  // no temporary file left

  // A narrow umask would leave 0400; the file is set to exactly 0600.
  std::string narrow = dir_ + "/narrow.json";
  old = ::umask(0277);
  auto narrow_ring = KeyRing::LoadOrCreate(narrow, &clock_);
  ::umask(old);
  ASSERT_OK(narrow_ring);
  EXPECT_EQ(Mode(narrow), 0600);
}

TEST_F(KeyRingFileTest, RefusesAFileThatOthersCanAccess) {
  ASSERT_TRUE(KeyRing::LoadOrCreate(path_, &clock_).ok());
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602}) {
    ASSERT_EQ(::chmod(path_.c_str(), mode), 0);
    auto ring = KeyRing::LoadOrCreate(path_, &clock_);
    ASSERT_FALSE(ring.ok()) << std::oct << mode;
    EXPECT_EQ(ring.status().code(), Code::kFailedPrecondition);
    std::string expected = "mode 0" + std::to_string(mode >> 6) + std::to_string((mode >> 3) & 7) +
                           std::to_string(mode & 7);
    EXPECT_NE(ring.status().message().find(expected), std::string::npos) << ring.status().message();
  }
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  EXPECT_TRUE(KeyRing::LoadOrCreate(path_, &clock_).ok());  // control
}

TEST_F(KeyRingFileTest, RefusesASymlinkAndACorruptFile) {
  std::string real = dir_ + "/real.json";
  ASSERT_TRUE(KeyRing::LoadOrCreate(real, &clock_).ok());
  ASSERT_EQ(::symlink(real.c_str(), path_.c_str()), 0);
  auto linked = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_FALSE(linked.ok());
  EXPECT_EQ(linked.status().code(), Code::kFailedPrecondition);
  ASSERT_EQ(::unlink(path_.c_str()), 0);

  const Json valid = {{"version", 1},
                      {"active", "k1"},
                      {"keys",
                       {{"k1",
                         {{"secret", std::string(43, 'Q') + "="},  // 32 bytes, canonical
                          {"created_at_ms", 1},
                          {"retired", false}}}}}};
  WriteFile(valid.dump());
  ASSERT_TRUE(KeyRing::LoadOrCreate(path_, &clock_).ok()) << "control";
  struct Case {
    const char* what;
    std::function<void(Json*)> change;
  };
  const std::vector<Case> cases = {
      {"no active", [](Json* d) { d->erase("active"); }},
      {"unknown version", [](Json* d) { (*d)["version"] = 2; }},
      {"active not among keys", [](Json* d) { (*d)["active"] = "k2"; }},
      {"active retired", [](Json* d) { (*d)["keys"]["k1"]["retired"] = true; }},
      {"short secret", [](Json* d) { (*d)["keys"]["k1"]["secret"] = "QUFB"; }},
      {"33-byte secret",
       [](Json* d) { (*d)["keys"]["k1"]["secret"] = std::string(43, 'Q') + "R"; }},
      {"non-canonical secret (unused bits set)",
       [](Json* d) { (*d)["keys"]["k1"]["secret"] = std::string(42, 'Q') + "R="; }},
      {"secret not a string", [](Json* d) { (*d)["keys"]["k1"]["secret"] = 5; }},
      {"created_at_ms not an integer", [](Json* d) { (*d)["keys"]["k1"]["created_at_ms"] = "1"; }},
      {"extra field", [](Json* d) { (*d)["x"] = 0; }},
      {"bad key id",
       [](Json* d) {
         (*d)["keys"]["k 1"] = (*d)["keys"]["k1"];
         (*d)["keys"].erase("k1");
         (*d)["active"] = "k 1";
       }},
  };
  for (const Case& c : cases) {
    Json doc = valid;
    c.change(&doc);
    WriteFile(doc.dump());
    auto ring = KeyRing::LoadOrCreate(path_, &clock_);
    ASSERT_FALSE(ring.ok()) << c.what;
    EXPECT_EQ(ring.status().code(), Code::kFailedPrecondition) << c.what;
  }
  WriteFile("not json");
  EXPECT_EQ(KeyRing::LoadOrCreate(path_, &clock_).status().code(), Code::kFailedPrecondition);
}

TEST_F(KeyRingFileTest, PersistsAndReloadsKeys) {
  auto first = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_OK(first);
  auto token = TokenSigner(&*first, &clock_).Mint("sg_0001", "book_flight", kFp, 60'000);
  ASSERT_OK(token);

  auto reloaded = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_OK(reloaded);
  EXPECT_EQ(reloaded->active_key_id(), "k1");
  EXPECT_TRUE(TokenSigner(&*reloaded, &clock_).Verify(*token, "sg_0001", "book_flight", kFp).ok());

  // Another keyring file has another secret under the same key id.
  auto elsewhere = KeyRing::LoadOrCreate(dir_ + "/other.json", &clock_);
  ASSERT_OK(elsewhere);
  EXPECT_EQ(elsewhere->active_key_id(), "k1");
  Tally tally;
  tally.Refused(TokenSigner(&*elsewhere, &clock_).Open(*token), *token);
  tally.Report("other keyring file", 1);
}

TEST_F(KeyRingFileTest, RotationAndRetirementPersist) {
  auto ring = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_OK(ring);
  TokenSigner signer(&*ring, &clock_);
  auto old_token = signer.Mint("sg_0001", "book_flight", kFp, 60'000);
  ASSERT_OK(old_token);
  clock_.AdvanceMs(5);
  auto k2 = ring->Rotate();
  ASSERT_OK(k2);
  EXPECT_EQ(Mode(path_), 0600);
  auto new_token = signer.Mint("sg_0001", "book_flight", kFp, 60'000);
  ASSERT_OK(new_token);

  {
    auto reloaded = KeyRing::LoadOrCreate(path_, &clock_);
    ASSERT_OK(reloaded);
    EXPECT_EQ(reloaded->active_key_id(), "k2");
    ASSERT_EQ(reloaded->keys().size(), 2u);
    EXPECT_EQ(reloaded->keys()[1].created_at_ms, 1'700'000'000'005);
    TokenSigner s(&*reloaded, &clock_);
    EXPECT_OK(s.Open(*old_token));
    EXPECT_OK(s.Open(*new_token));
  }

  ASSERT_OK(ring->Retire("k1"));
  auto reloaded = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_OK(reloaded);
  EXPECT_TRUE(reloaded->keys()[0].retired);
  TokenSigner s(&*reloaded, &clock_);
  Tally tally;
  tally.Refused(s.Open(*old_token), *old_token);
  tally.Report("retired key after reload", 1);
  EXPECT_OK(s.Open(*new_token));
  EXPECT_EQ(Mode(path_), 0600);
  EXPECT_EQ(DirEntries(), (std::vector<std::string>{"keys.json", "keys.json.lock"}));
}

TEST_F(KeyRingFileTest, ReloadSeesRetirementByAnotherProcess) {
  auto server = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_OK(server);
  TokenSigner signer(&*server, &clock_);
  auto token = signer.Mint("sg_0001", "book_flight", kFp, 60'000);
  ASSERT_OK(token);
  {
    auto operator_ring = KeyRing::LoadOrCreate(path_, &clock_);
    ASSERT_OK(operator_ring);
    ASSERT_OK(operator_ring->Rotate());
    ASSERT_OK(operator_ring->Retire("k1"));
  }
  EXPECT_OK(signer.Open(*token));  // not yet reloaded
  ASSERT_OK(server->Reload());
  EXPECT_EQ(server->active_key_id(), "k2");
  Tally tally;
  tally.Refused(signer.Open(*token), *token);
  tally.Report("retired elsewhere, then reloaded", 1);

  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  EXPECT_EQ(server->Reload().code(), Code::kFailedPrecondition);
  EXPECT_EQ(server->active_key_id(), "k2");  // kept
}

TEST_F(KeyRingFileTest, RotationKeepsKeysAddedByAnotherProcess) {
  auto a = KeyRing::LoadOrCreate(path_, &clock_);
  auto b = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto from_a = a->Rotate();
  ASSERT_OK(from_a);
  EXPECT_EQ(*from_a, "k2");
  auto from_b = b->Rotate();  // b re-reads the file under the lock first
  ASSERT_OK(from_b);
  EXPECT_EQ(*from_b, "k3");
  auto reloaded = KeyRing::LoadOrCreate(path_, &clock_);
  ASSERT_OK(reloaded);
  EXPECT_EQ(reloaded->keys().size(), 3u);
  EXPECT_EQ(reloaded->active_key_id(), "k3");
}

}  // namespace
}  // namespace idem::preview_commit
