#pragma once
// The step graph of a saga: which steps each step runs after (its `after`
// list in the spec), checked when the spec is parsed, and which steps are
// ready to run in a given situation.
//
// The rule for steps without `after` (chosen so that nothing changes under
// anyone's feet):
//   - a spec in which no step says `after` runs its steps one after another,
//     each after the previous one: today's order, and the meaning of every
//     spec frozen in a journal before `after` existed;
//   - a spec in which some step says `after` must say it on every step but
//     the first (`"after": []` for a step that depends on nothing): no step's
//     order is implied by its position, so adding `after` to one step cannot
//     silently change another's. The checker refuses a missing one, saying
//     so.
//
// Thread safety: pure functions.

#include <map>
#include <string>
#include <vector>

#include "saga/states.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// The parsed step graph: parents[i] lists the steps step i runs after
/// (indices, in the order written); before[i][j] is true when step j runs
/// before step i in every drive (an ancestor: a parent, or a parent's
/// ancestor).
struct StepGraph {
  bool declared = false;  ///< some step says `after`
  std::vector<std::vector<int>> parents;
  std::vector<std::vector<bool>> before;
};

/// Reads the `after` lists of `steps` (the spec's "steps" array, already
/// checked by the schema; `first_at` maps each id to its first index).
/// Errors name the place (kInvalidArgument): an unknown step, the step
/// itself, a step listed twice, a missing `after` in a spec that uses it,
/// and a cycle, named step by step: `steps[0].after: cycle "a" -> "b" -> "a"`.
Result<StepGraph> ParseStepGraph(const Json& steps, const std::map<std::string, size_t>& first_at);

/// The steps that may be driven forward now, in index order: not ended
/// (planned, previewed, awaiting approval, or uncertain after a crash:
/// submitted, unknown) with every parent succeeded. A `processing` step is
/// in flight at its provider (saga/completion.h): not ready and not
/// settled, so its dependants wait; the forward driver drives it again only
/// when its check is due (saga/branches.h).
std::vector<int> ReadySteps(const std::vector<std::vector<int>>& parents,
                            const std::vector<StepState>& states);

}  // namespace idem
