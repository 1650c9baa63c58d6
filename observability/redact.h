#pragma once
// The one place where secrets are taken out of what is logged.
//
// A secret is recognised by its field name (token, commit_token, *_token,
// authorization, secret, *_secret, password, token_sha256, ...) and by its
// shape inside any string (a commit token `idem1.<claims>.<mac>`, a
// `Bearer <value>` credential), so a secret quoted in an error message is
// caught too. Redacted values become "[redacted]".
//
// Thread safety: pure functions.

#include <string>
#include <string_view>

#include "common/json_util.h"

namespace idem::observability {

inline constexpr const char* kRedacted = "[redacted]";

/// True when a field of this name holds a secret (case-insensitive).
bool IsSecretField(std::string_view name);

/// `text` with every commit token and bearer credential replaced.
std::string RedactText(std::string_view text);

/// `value` with secret fields (at any depth) and secrets in strings replaced.
Json Redact(const Json& value);

}  // namespace idem::observability
