#pragma once
// SpecRegistry: named, versioned saga specs the server's callers submit by
// name. Internal to the server (server/server.h is the module's API).
//
// Versions are kept: a version, once stored, never changes. Putting a
// version that exists with the same canonical document is a no-op (created
// false); with another document, kConflict.
//
// Owners (issue 12, item 6): a name belongs to the caller whose put created
// it (Claim). Only the owner adds versions; the owner may share the name, and
// then every caller may read and run it (MayUse). Without an auth file every
// caller is "anonymous", which owns every name it registers: one registry,
// as before owners.
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

  /// Claims `name` for `by` unless it has an owner; the owner as stored.
  Result<storage::SpecOwner> Claim(const std::string& name, const std::string& by);
  /// kNotFound when the name has no owner.
  Result<storage::SpecOwner> Owner(const std::string& name);
  Result<std::vector<storage::SpecOwner>> Owners();
  Status SetShared(const std::string& name, bool shared);
  /// True when `caller` may read and run the specs of `owner`'s name.
  static bool MayUse(const storage::SpecOwner& owner, const std::string& caller) {
    return owner.shared || owner.owner == caller;
  }

 private:
  storage::SpecStore* const specs_;
  Clock* const clock_;
};

}  // namespace idem::server
