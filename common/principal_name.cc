#include "common/principal_name.h"

#include <cstdint>
#include <locale>
#include <vector>

#include <boost/locale.hpp>

#include "common/utf8.h"

namespace idem {
namespace {

constexpr size_t kMaxNameBytes = 64;

// The code points of `s`, or false when it is not UTF-8 (common/utf8.h).
bool DecodeUtf8(const std::string& s, std::vector<uint32_t>* out) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    if (!NextCodePoint(s, &i, &cp)) return false;
    out->push_back(cp);
  }
  return true;
}

bool AsciiNameChar(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// Controls, spaces and characters that show nothing: a name with them could
// look like another name, or like no name at all.
bool Invisible(uint32_t c) {
  struct Range {
    uint32_t from, to;
  };
  static constexpr Range kRanges[] = {
      {0x0080, 0x00A0},    // C1 controls, no-break space
      {0x00AD, 0x00AD},    // soft hyphen
      {0x034F, 0x034F},    // combining grapheme joiner
      {0x061C, 0x061C},    // Arabic letter mark
      {0x115F, 0x1160},    // Hangul fillers
      {0x1680, 0x1680},    // Ogham space mark
      {0x17B4, 0x17B5},    // Khmer inherent vowels
      {0x180B, 0x180F},    // Mongolian variation selectors, vowel separator
      {0x2000, 0x200F},    // spaces, zero widths, directional marks
      {0x2028, 0x202F},    // separators, bidirectional embeddings, narrow space
      {0x205F, 0x206F},    // medium space, invisible operators, isolates
      {0x2800, 0x2800},    // braille blank
      {0x3000, 0x3000},    // ideographic space
      {0x3164, 0x3164},    // Hangul filler
      {0xFE00, 0xFE0F},    // variation selectors
      {0xFEFF, 0xFEFF},    // zero width no-break space
      {0xFFA0, 0xFFA0},    // halfwidth Hangul filler
      {0xFFF0, 0xFFFF},    // specials
      {0x1D173, 0x1D17A},  // musical formatting
      {0xE0000, 0xE0FFF},  // tags, variation selectors supplement
  };
  for (const Range& r : kRanges) {
    if (c >= r.from && c <= r.to) return true;
  }
  return false;
}

const std::locale& IcuLocale() {
  static const std::locale locale = [] {
    boost::locale::localization_backend_manager manager =
        boost::locale::localization_backend_manager::global();
    manager.select("icu");
    boost::locale::generator generator(manager);
    return generator("en_US.UTF-8");
  }();
  return locale;
}

}  // namespace

std::string FoldName(const std::string& name) {
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(name, &cps)) return name;
  bool ascii = true;
  for (uint32_t c : cps) ascii = ascii && c < 0x80;
  if (ascii) {  // the common case, without ICU: NFKC leaves ASCII as it is
    std::string out = name;
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  try {
    const std::locale& loc = IcuLocale();
    const std::string nfkc = boost::locale::normalize(name, boost::locale::norm_nfkc, loc);
    const std::string folded = boost::locale::fold_case(nfkc, loc);
    return boost::locale::normalize(folded, boost::locale::norm_nfkc, loc);
  } catch (const std::exception&) {
    return name;  // ICU refused the text: compare it as written
  }
}

bool SameName(const std::string& a, const std::string& b) { return FoldName(a) == FoldName(b); }

std::string PrincipalNameProblem(const std::string& name) {
  const std::string expected =
      "expected 1 to 64 bytes of UTF-8: ASCII letters, digits, '.', '_', '-', or printable "
      "characters beyond ASCII (no spaces, controls or invisible characters)";
  if (name.empty() || name.size() > kMaxNameBytes) return expected;
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(name, &cps)) return expected;
  for (uint32_t c : cps) {
    if (c < 0x80 ? !AsciiNameChar(c) : Invisible(c)) return expected;
  }
  return "";
}

}  // namespace idem
