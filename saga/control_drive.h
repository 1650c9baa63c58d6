#pragma once
// How a drive honours the saga's durable control request
// (storage/control_store.h): asked before the drive starts and between
// steps (saga/drive.cc), so whichever process drives the saga carries out a
// cancel, pause or resume recorded by any process, before or after a restart.
//
// By the saga's state when the drive asks:
//   cancel  pending, running: rollback (a pending saga is cancelled);
//           paused: rollback, or cancelled when nothing is to be undone;
//           awaiting approval: the waiting commit is rejected here (its token
//           is void from then on) and the drive rolls back from there;
//           needs attention: waits for a person's resolve, then as above;
//           compensating or finished: moot (settled).
//   pause   pending, running, compensating: the saga parks `paused` (no
//           lease held); waiting for a person: waits; paused or finished: moot.
//   resume  paused: back the way it was going (running, or compensating);
//           anything else: moot.
//
// Thread safety: none; the run belongs to the driving thread.

#include <optional>
#include <string>

#include "saga/machines.h"
#include "saga/run.h"
#include "storage/control_store.h"

#include "common/status.h"

namespace idem {

/// What a pending control request asks the drive to do now.
struct ControlOrder {
  storage::ControlRequest request;
  SagaEvent event = SagaEvent::kCancelRequested;
  SagaFacts facts;
  std::string reason;  ///< kept on the saga's record ("" for a resume)
};

/// Reads the saga's pending request and judges it against the run's state:
/// an order for the drive to fire (then flush, then settle the request), or
/// nullopt: no request, one that waits, or one settled here (moot, or the
/// rejection of a waiting commit, written before it is settled).
Result<std::optional<ControlOrder>> JudgeControl(SagaRun* run);

/// The reason a request gives the saga: the caller's for a cancel (else
/// "cancelled by WHO"); "paused by WHO[: reason]" for a pause.
std::string ControlReason(const storage::ControlRequest& request);

}  // namespace idem
