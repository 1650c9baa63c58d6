#include "common/time_ordered_id.h"

#include <stdexcept>

#include "common/clock.h"
#include "common/json_util.h"
#include <openssl/rand.h>

namespace idem {
namespace {

constexpr char kSorted[] = "234567abcdefghijklmnopqrstuvwxyz";  // ASCII order
constexpr size_t kChars = 26;                                   // ceil(128 / 5)

}  // namespace

std::string Base32(const unsigned char* bytes, size_t n, const char* alphabet) {
  std::string out;
  out.reserve((n * 8 + 4) / 5);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    acc = (acc << 8) | bytes[i];
    bits += 8;
    while (bits >= 5) {
      out.push_back(alphabet[(acc >> (bits - 5)) & 31]);
      bits -= 5;
    }
  }
  if (bits > 0) out.push_back(alphabet[(acc << (5 - bits)) & 31]);
  return out;
}

std::string NewTimeOrderedId(const std::string& prefix, int64_t now_ms) {
  unsigned char bytes[16];
  const uint64_t ms = static_cast<uint64_t>(now_ms) & 0xFFFFFFFFFFFFull;
  for (int i = 0; i < 6; ++i) bytes[i] = static_cast<unsigned char>(ms >> (8 * (5 - i)));
  if (RAND_bytes(bytes + 6, 10) != 1) throw std::runtime_error("RAND_bytes failed");
  return prefix + Base32(bytes, sizeof bytes, kSorted);
}

int64_t TimeOrderedIdMs(const std::string& id, const std::string& prefix) {
  if (id.size() != prefix.size() + kChars || id.compare(0, prefix.size(), prefix) != 0) return -1;
  uint64_t ms = 0;
  // 48 bits: the first 9 characters (45 bits) and 3 bits of the 10th.
  for (size_t i = 0; i < 10; ++i) {
    const char c = id[prefix.size() + i];
    int v = c >= '2' && c <= '7' ? c - '2' : c >= 'a' && c <= 'z' ? c - 'a' + 6 : -1;
    if (v < 0) return -1;
    ms = i < 9 ? (ms << 5) | static_cast<uint64_t>(v) : (ms << 3) | (static_cast<uint64_t>(v) >> 2);
  }
  return static_cast<int64_t>(ms);
}

std::string NewSagaId(bool random) {
  return random ? NewId("sg_") : NewTimeOrderedId("sg_", SystemClock::Get()->NowMs());
}

}  // namespace idem
