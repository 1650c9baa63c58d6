#pragma once
// JSON helpers shared by every module: canonical encoding, fingerprints, ids.
//
// Canonical encoding (the rule behind every fingerprint): object keys sorted
// by their UTF-8 bytes, no insignificant whitespace, strings escaped as
// nlohmann::json does (UTF-8 kept, control characters as \u00XX), numbers
// in their parsed type (1 and 1.0 differ; integers print exactly, doubles
// round-trip). Two documents that differ only in key order or whitespace
// have the same fingerprint.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace idem {

using Json = nlohmann::json;

/// The canonical text of a JSON value (see above).
std::string CanonicalJson(const Json& value);

/// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(const std::string& data);

/// "sha256:" + Sha256Hex(CanonicalJson(value)).
std::string Fingerprint(const Json& value);

/// A fresh random identifier: `prefix` + 26 lower-case base32 characters
/// (128 bits from the OS random source).
std::string NewId(const std::string& prefix);

/// Parses JSON text. On error, InvalidArgument naming `where` and the byte
/// offset. Rejects nesting deeper than `max_depth`.
Result<Json> ParseJson(const std::string& text, const std::string& where, int max_depth = 64);

/// `text` with every byte outside printable ASCII (and the backslash)
/// escaped as \xHH: safe to put in an error message or a log line.
std::string PrintableText(const std::string& text);

/// RFC 3339 UTC text for a millisecond timestamp, e.g. 2026-11-30T12:00:00.123Z.
std::string FormatTimeMs(int64_t ms);

}  // namespace idem
