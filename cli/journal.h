#pragma once
// `idem journal check | accept-regression`: the journal's high-water mark
// (storage/high_water_mark.h) seen from the command line.
//
//   check                                  OK, or the regression (kFailedPrecondition: a
//   regression) accept-regression --as NAME --reason   records the decision, then the
//                                          journal drives again
//
// Thread safety: called once, from RunCli.

#include <string>

#include "storage/store.h"

#include "common/status.h"

namespace idem::cli {

/// Runs `journal ACTION` on `store`, printing what it did on stdout. The
/// journal's regression is returned as it is (kFailedPrecondition: a regression); kInvalidArgument
/// for an unknown action or a missing name or reason.
Status JournalCommand(const std::string& action, const std::string& who, const std::string& reason,
                      storage::Store* store);

}  // namespace idem::cli
