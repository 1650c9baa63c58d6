#include "observability/redact.h"

#include <algorithm>
#include <cctype>

namespace idem::observability {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// The characters of a commit token (base64url parts joined by dots) or of a
// bearer credential.
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == '=' || c == '+' || c == '/' || c == '~';
}

// Replaces the token run after each `marker` (matched case-insensitively in
// `lower`, the lower-case copy of `s`), keeping the marker itself.
void ReplaceAfter(std::string* s, std::string_view marker) {
  size_t from = 0;
  for (;;) {
    std::string lower = Lower(*s);
    size_t at = lower.find(marker, from);
    if (at == std::string::npos) return;
    size_t begin = at + marker.size();
    size_t end = begin;
    while (end < s->size() && IsTokenChar((*s)[end])) ++end;
    if (end == begin || s->compare(begin, end - begin, kRedacted) == 0) {
      from = begin;
      continue;
    }
    s->replace(begin, end - begin, kRedacted);
    from = begin + std::string_view(kRedacted).size();
  }
}

}  // namespace

bool IsSecretField(std::string_view name) {
  const std::string n = Lower(name);
  static const char* const kNames[] = {
      "token",    "commit_token", "authorization", "bearer",      "secret",
      "password", "token_sha256", "signing_key",   "private_key", "api_key",
      "cookie",   "set-cookie",   "nonce"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return EndsWith(n, "_token") || EndsWith(n, "_secret") || EndsWith(n, "_password");
}

std::string RedactText(std::string_view text) {
  std::string s(text);
  ReplaceAfter(&s, "idem1.");
  ReplaceAfter(&s, "bearer ");
  return s;
}

Json Redact(const Json& value) {
  if (value.is_string()) return RedactText(value.get_ref<const std::string&>());
  if (value.is_array()) {
    Json out = Json::array();
    for (const auto& v : value) out.push_back(Redact(v));
    return out;
  }
  if (value.is_object()) {
    Json out = Json::object();
    for (const auto& [k, v] : value.items())
      out[k] = IsSecretField(k) ? Json(kRedacted) : Redact(v);
    return out;
  }
  return value;
}

}  // namespace idem::observability
