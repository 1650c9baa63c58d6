#include "effect/mutation.h"

#include <atomic>
#include <cstring>
#include <string>

namespace idem::effect {
namespace {

std::atomic<int> g_mutation{0};

constexpr const char* kNames[] = {"none", "undo-resends-after-any-lookup",
                                  "guard-reads-accepted-as-absent", "drift-asks-the-row-key",
                                  "call-id-ignores-arguments"};
constexpr int kCount = sizeof(kNames) / sizeof(kNames[0]);

}  // namespace

void SetMutation(Mutation m) { g_mutation.store(static_cast<int>(m)); }

bool Mutated(Mutation m) {
  return m != Mutation::kNone && g_mutation.load(std::memory_order_relaxed) == static_cast<int>(m);
}

bool ParseMutation(const char* text, Mutation* out) {
  if (text == nullptr) return false;
  for (int i = 0; i < kCount; ++i) {
    if (std::strcmp(text, kNames[i]) == 0 || std::to_string(i) == text) {
      *out = static_cast<Mutation>(i);
      return true;
    }
  }
  return false;
}

const char* MutationName(Mutation m) {
  const int i = static_cast<int>(m);
  return i >= 0 && i < kCount ? kNames[i] : "unknown";
}

}  // namespace idem::effect
