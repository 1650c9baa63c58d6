#pragma once
// Names of people and callers (the auth file's principals, who approved a
// commit, who asked for a call) as idem compares them: two spellings that a
// person reads as one name are one name. "maria", "Maria", "MARIA" and the
// fullwidth "ｍaria" must never count as two people toward a quorum, nor let
// a requester approve their own call under another spelling.
//
// The folded form is Unicode NFKC, then full case folding, then NFKC again
// (the fixed point of toNFKC_Casefold for names), by ICU through
// Boost.Locale. Names are shown and journaled as written; only comparisons
// fold.
//
// Thread safety: pure functions (the ICU locale is built once, then only
// read).

#include <string>

namespace idem {

/// The form of `name` that comparisons use. Text that is not valid UTF-8 is
/// returned unchanged (it folds to nothing else).
std::string FoldName(const std::string& name);

/// True when `a` and `b` are one name: FoldName(a) == FoldName(b).
bool SameName(const std::string& a, const std::string& b);

/// "" when `name` may name a principal: 1 to 64 bytes of UTF-8; ASCII
/// letters, digits, '.', '_', '-', and any other printable character
/// outside ASCII but spaces, controls and invisible format characters (zero
/// widths, bidirectional controls, variation selectors, tags). Otherwise
/// what is wrong with it.
std::string PrincipalNameProblem(const std::string& name);

}  // namespace idem
