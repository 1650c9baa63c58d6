#pragma once
// UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, nothing
// above U+10FFFF. One decoder for every place that reads outside text (the
// server's request bodies, principal names).
//
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string>

namespace idem {

/// Decodes the code point that starts at byte `*at` of `s` into `*cp` and
/// moves `*at` past it; false (and nothing moved) when the bytes there are
/// not a well-formed UTF-8 sequence. `*at` must be below s.size().
bool NextCodePoint(const std::string& s, size_t* at, uint32_t* cp);

}  // namespace idem
