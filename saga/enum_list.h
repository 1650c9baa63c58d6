#pragma once
// Enums defined once, as X-macro lists: X(Name, "name") for enumerator kName.
//
// A list such as IDEM_STEP_STATES(X) is the single definition of its enum;
// these macros derive the declaration, the name switch and the parser from
// it, so adding a value is one edit to the list. The names of persisted
// enums are stored on disk: never change one.
//
//   IDEM_DECLARE_ENUM(StepState, IDEM_STEP_STATES);         // in a header
//   const char* StepStateName(StepState s) {
//     IDEM_ENUM_NAME(StepState, IDEM_STEP_STATES, s);       // returns a name
//     return "?";                                           // out of range
//   }
//   std::optional<StepState> ParseStepState(const std::string& n) {
//     IDEM_ENUM_PARSE(StepState, IDEM_STEP_STATES, n);      // returns a value
//     return std::nullopt;
//   }

#include <string>

#define IDEM_ENUM_ENUMERATOR_(e, name) k##e,
#define IDEM_ENUM_NAME_CASE_(e, name) \
  case EnumT_::k##e:                  \
    return name;
#define IDEM_ENUM_PARSE_IF_(e, name) \
  if (name_ == (name)) return EnumT_::k##e;

/// `enum class Type { ... }` with the list's enumerators, in list order.
#define IDEM_DECLARE_ENUM(Type, LIST) enum class Type { LIST(IDEM_ENUM_ENUMERATOR_) }

/// Returns the list's name for `value`; falls through for a value outside it.
#define IDEM_ENUM_NAME(Type, LIST, value)         \
  do {                                            \
    using EnumT_ = Type;                          \
    switch (value) { LIST(IDEM_ENUM_NAME_CASE_) } \
  } while (0)

/// Returns the value named `name`; falls through when no value has that name.
#define IDEM_ENUM_PARSE(Type, LIST, name) \
  do {                                    \
    using EnumT_ = Type;                  \
    const std::string& name_ = (name);    \
    LIST(IDEM_ENUM_PARSE_IF_)             \
  } while (0)
