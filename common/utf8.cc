#include "common/utf8.h"

namespace idem {

bool NextCodePoint(const std::string& s, size_t* at, uint32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t i = *at;
  const unsigned char c = p[i];
  if (c < 0x80) {
    *cp = c;
    *at = i + 1;
    return true;
  }
  size_t len = 0;
  uint32_t v = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    v = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    v = c & 0x07;
  } else {
    return false;
  }
  if (i + len > s.size()) return false;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = p[i + k];
    if ((cc & 0xC0) != 0x80) return false;
    v = (v << 6) | (cc & 0x3F);
  }
  if ((len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
      (v >= 0xD800 && v <= 0xDFFF)) {
    return false;
  }
  *cp = v;
  *at = i + len;
  return true;
}

}  // namespace idem
