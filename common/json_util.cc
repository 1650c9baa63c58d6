#include "common/json_util.h"

#include <ctime>
#include <stdexcept>

#include "common/time_ordered_id.h"  // Base32
#include <openssl/evp.h>
#include <openssl/rand.h>

namespace idem {

std::string CanonicalJson(const Json& value) {
  // nlohmann::json keeps object keys in a std::map, so dump() already sorts
  // them bytewise; compact dump has no whitespace. Invalid UTF-8 is replaced
  // rather than thrown on: canonical text must always exist.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("EVP_Digest(sha256) failed");  // a bug or a broken OpenSSL
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

std::string Fingerprint(const Json& value) { return "sha256:" + Sha256Hex(CanonicalJson(value)); }

std::string NewId(const std::string& prefix) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  return prefix + Base32(bytes, sizeof bytes, "abcdefghijklmnopqrstuvwxyz234567");
}

std::string PrintableText(const std::string& text) {
  // Keeps printable ASCII; escapes everything else as \xHH so that bytes
  // from outside cannot break a terminal, a log line or a JSON document.
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

Result<Json> ParseJson(const std::string& text, const std::string& where, int max_depth) {
  // Depth is checked before parsing so that hostile nesting never reaches the
  // parser or the recursive destructor.
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return Status::InvalidArgument(where + ": JSON nested deeper than " +
                                       std::to_string(max_depth) + " levels (at byte " +
                                       std::to_string(i) + ")");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    // parse_error, or out_of_range for a number too large ("1e400").
    std::string msg = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    return Status::InvalidArgument(where + ": invalid JSON: " + PrintableText(msg));
  }
}

std::string FormatTimeMs(int64_t ms) {
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

}  // namespace idem
