#pragma once
// SpecRegistry: named, versioned saga specs the server's callers submit by
// name. Internal to the server (server/server.h is the module's API).
//
// Versions are kept: a version, once stored, never changes. Putting a
// version that exists with the same canonical document is a no-op (created
// false); with another document, kConflict.
//
// Storage: a storage::SpecStore (storage/server_state.h), the table
// `server_specs` in the journal's database, so that every server on one
// database knows the same specs.
// Thread safety: every method may be called from several threads at once.

#include <memory>
#include <string>
#include <vector>

#include "storage/server_state.h"

#include "common/clock.h"
#include "common/json_util.h"
#include "common/status.h"

namespace idem::server {

using SpecVersion = storage::StoredSpec;

struct SpecPut {
  SpecVersion version;
  bool created = false;
};

class SpecRegistry {
 public:
  /// The registry over `specs`; `clock` stamps new versions. Neither is
  /// owned; both must outlive the registry.
  SpecRegistry(storage::SpecStore* specs, Clock* clock);

  /// Stores `doc` as `name` version `version`. kConflict: that version
  /// exists with another document.
  Result<SpecPut> Put(const std::string& name, int version, const Json& doc, const std::string& by);
  /// `version` 0: the latest. kNotFound when absent.
  Result<SpecVersion> Get(const std::string& name, int version);
  /// Every version of every spec, by name then version.
  Result<std::vector<SpecVersion>> List();

 private:
  storage::SpecStore* const specs_;
  Clock* const clock_;
};

}  // namespace idem::server
