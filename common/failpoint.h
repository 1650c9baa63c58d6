#pragma once
// Named failpoints (RELIABILITY.md H1), compiled into every build.
//
// A failpoint is a named site in the code: IDEM_FAILPOINT("step.after_submitted").
// It does nothing unless armed through the environment variable
//   IDEM_FAILPOINT="name=ACTION[@N][;name=ACTION...]"
// where ACTION is one of
//   kill        raise(SIGKILL): the process dies as in a crash
//   err         the site reports an injected error (sites that can fail)
//   sleep(MS)   the site sleeps MS milliseconds
//   off         disarmed
// and @N fires on the N-th time the site is reached (1-based) and not before;
// without @N it fires every time.
//
// Every name must be one of the known sites (KnownFailpoints()); arming an
// unknown name is an error, so a typo in a crash test cannot pass silently.
//
// Thread safety: Hit() is safe from any thread; Arm*() is for start-up and tests.

#include <string>
#include <vector>

#include "common/status.h"

namespace idem::failpoint {

/// Every failpoint name compiled into idem, with the boundary it marks.
struct Site {
  const char* name;
  const char* boundary;
};
const std::vector<Site>& KnownFailpoints();

/// Arms failpoints from a specification string (the IDEM_FAILPOINT syntax).
/// Returns InvalidArgument naming the bad entry; nothing is armed then.
Status Arm(const std::string& spec);

/// Arms from the IDEM_FAILPOINT environment variable, if set.
Status ArmFromEnv();

/// Disarms every failpoint and resets hit counters.
void DisarmAll();

/// Called at the site. Returns true when the site is armed with `err` and
/// fires now; `kill` never returns; `sleep` returns false after sleeping.
bool Hit(const char* name);

/// How many times a site was reached since the last DisarmAll().
int HitCount(const std::string& name);

}  // namespace idem::failpoint

/// Marks a failpoint site. Evaluates to true when an `err` action fires.
#define IDEM_FAILPOINT(name) ::idem::failpoint::Hit(name)
