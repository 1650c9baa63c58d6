#pragma once
// Internal: the one Boost.MSM configuration and the parts both transition
// tables share (saga/step_machine.cc, saga/saga_machine.cc). Include it
// first in a table file, before any Boost header, so that every table is
// built with the same MPL limits. Never include it from a public header.
//
// Shared parts, for a machine whose states, events and commands are
// X-macro lists (saga/enum_list.h):
//  - MachineState<Enum, kValue>: a state that records its id on entry;
//  - Emit<kCommand>: an action that emits one command;
//  - Holds<&Facts::field> and Not<Guard>: guards on the facts an event carries;
//  - Restoring + IDEM_MSM_RESTORE_ROW: one guarded row per state, so a
//    machine resumes a persisted state through its own table;
//  - MachineBase: the refusal bookkeeping; Process: one event in, the
//    commands or kIllegalTransition out;
//  - IDEM_MSM_EVENT_STRUCT / IDEM_MSM_DISPATCH: one event struct per
//    enumerator and the switch from the enum to it.

// The tables have more rows than MPL's preprocessed default of 20; these
// limits must be multiples of 10, and 50 is the most MPL ships.
#define BOOST_MPL_CFG_NO_PREPROCESSED_HEADERS
#define BOOST_MPL_LIMIT_VECTOR_SIZE 50
#define BOOST_MPL_LIMIT_MAP_SIZE 50
#include <exception>
#include <string>
#include <vector>

#include <boost/msm/back/state_machine.hpp>
#include <boost/msm/front/functor_row.hpp>
#include <boost/msm/front/state_machine_def.hpp>

#include "common/status.h"

namespace idem {
namespace machine_detail {

namespace msm = boost::msm;
namespace msmf = boost::msm::front;
namespace mpl = boost::mpl;

/// A state of the machine: records its id in the machine on entry.
template <class Enum, Enum kId>
struct MachineState : msmf::state<> {
  static constexpr Enum id = kId;
  template <class Event, class Fsm>
  void on_entry(const Event&, Fsm& fsm) {
    fsm.current = kId;
  }
};

/// The pseudo-state a machine starts in, until `Restore{state}` moves it.
struct Restoring : msmf::state<> {};

/// Action: emits one command.
template <auto kCommand>
struct Emit {
  template <class Event, class Fsm, class Source, class Target>
  void operator()(const Event&, Fsm& fsm, Source&, Target&) {
    fsm.commands.push_back(kCommand);
  }
};

/// Guard: the fact `Field` of the event's facts holds.
template <auto Field>
struct Holds {
  template <class Event, class Fsm, class Source, class Target>
  bool operator()(const Event& e, Fsm&, Source&, Target&) {
    return e.facts.*Field;
  }
};

/// Guard: `Guard` does not hold.
template <class Guard>
struct Not {
  template <class Event, class Fsm, class Source, class Target>
  bool operator()(const Event& e, Fsm& fsm, Source& s, Target& t) {
    return !Guard()(e, fsm, s, t);
  }
};

/// Guard of the restore rows: `Restore{target}` names this row's target.
struct RestoresTarget {
  template <class Event, class Fsm, class Source, class Target>
  bool operator()(const Event& e, Fsm&, Source&, Target&) {
    return e.target == Target::id;
  }
};

/// The bookkeeping shared by both machine definitions.
template <class Derived, class State, class Command>
struct MachineBase : msmf::state_machine_def<Derived> {
  using initial_state = Restoring;

  State current{};
  std::vector<Command> commands;
  bool refused = false;

  template <class Fsm, class Event>
  void no_transition(const Event&, Fsm&, int) {
    refused = true;
  }
  template <class Fsm, class Event>
  void exception_caught(const Event&, Fsm&, std::exception&) {
    refused = true;
  }
};

/// Processes one event: the commands of the row taken, or kIllegalTransition
/// ("<machine> in state <s> does not accept <event>") with the state kept.
template <class Fsm, class Event>
Result<decltype(Fsm::commands)> Process(Fsm& fsm, const Event& event, const char* machine,
                                        const char* (*state_name)(decltype(Fsm::current)),
                                        const char* event_name) {
  fsm.commands.clear();
  fsm.refused = false;
  auto before = fsm.current;
  fsm.process_event(event);
  if (fsm.refused) {
    return Status::IllegalTransition(std::string(machine) + " in state " + state_name(before) +
                                     " does not accept " + event_name);
  }
  return fsm.commands;
}

}  // namespace machine_detail
}  // namespace idem

/// `using Name = MachineState<StateEnum_, StateEnum_::kName>;` for a state
/// list; the file declares `using StateEnum_ = ...;` first.
#define IDEM_MSM_STATE_ALIAS(Name, name) \
  using Name = ::idem::machine_detail::MachineState<StateEnum_, StateEnum_::k##Name>;

/// Restoring --ev::Restore{kName}--> Name, for a state list inside a table.
#define IDEM_MSM_RESTORE_ROW(Name, name) \
  msmf::Row<Restoring, ev::Restore, Name, msmf::none, RestoresTarget>,

/// `struct Name { Facts facts; };` for an event list, inside the namespace
/// that declares `using Facts = ...;`.
#define IDEM_MSM_EVENT_STRUCT(Name, name) \
  struct Name {                           \
    Facts facts;                          \
  };

#define IDEM_MSM_DISPATCH_CASE_(Name, name) \
  case EventEnum_::k##Name:                 \
    return process_(ev::Name{facts_});

/// Switches `event` (an enum of the list) to `process(ev::Name{facts})` and
/// returns its result; falls through for a value outside the list.
#define IDEM_MSM_DISPATCH(Type, LIST, event, facts, process) \
  do {                                                       \
    using EventEnum_ = Type;                                 \
    const auto& facts_ = (facts);                            \
    auto&& process_ = (process);                             \
    switch (event) { LIST(IDEM_MSM_DISPATCH_CASE_) }         \
  } while (0)
