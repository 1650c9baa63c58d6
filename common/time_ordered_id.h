#pragma once
// Time-ordered ids (UUIDv7's layout): a prefix, then 128 bits in 26
// characters of base32 over "234567abcdefghijklmnopqrstuvwxyz": 48 bits of
// milliseconds since 1970, then 80 random bits (OpenSSL's RAND_bytes).
//
// The same text as NewId's (common/json_util.h): the prefix, then 26
// characters of [a-z2-7]; only the order of the alphabet differs, ASCII
// order, so that ids sort as their times do. Saga ids are made this way so
// that the inserts of one group commit land on the same B-tree pages of the
// sagas', steps' and journal's indexes instead of one random page each.
// 80 random bits keep an id unguessable: a caller who knows the moment still
// has 2^80 candidates, and ids of the same millisecond do not collide in
// practice.
//
// Thread safety: safe from any thread. Errors: throws std::runtime_error if
// the random generator fails (as NewId does).

#include <cstddef>
#include <cstdint>
#include <string>

namespace idem {

/// `prefix` + 26 characters: `now_ms` (the low 48 bits), then 80 random bits.
std::string NewTimeOrderedId(const std::string& prefix, int64_t now_ms);

/// The milliseconds an id of NewTimeOrderedId carries, or -1 if `id` (with
/// `prefix`) is not one.
int64_t TimeOrderedIdMs(const std::string& id, const std::string& prefix);

/// `bytes` in base32 over `alphabet` (32 characters), 5 bits a character
/// from the first byte's high bits, the last character padded with zero bits
/// (NewId's and NewTimeOrderedId's text).
std::string Base32(const unsigned char* bytes, size_t n, const char* alphabet);

/// A new saga id ("sg_" + 26 characters): NewTimeOrderedId at the system
/// clock's time, or NewId's 128 random bits when `random`.
std::string NewSagaId(bool random);

}  // namespace idem
