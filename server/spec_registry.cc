#include "server/spec_registry.h"

#include <utility>

namespace idem::server {

SpecRegistry::SpecRegistry(storage::SpecStore* specs, Clock* clock)
    : specs_(specs), clock_(clock) {}

Result<SpecPut> SpecRegistry::Put(const std::string& name, int version, const Json& doc,
                                  const std::string& by) {
  SpecVersion v{name, version, doc, Fingerprint(doc), clock_->NowMs(), by};
  Result<storage::SpecPutOutcome> put = specs_->PutSpec(v);
  if (!put.ok()) return put.status();
  return SpecPut{std::move(put->spec), put->created};
}

Result<SpecVersion> SpecRegistry::Get(const std::string& name, int version) {
  return specs_->GetSpec(name, version);
}

Result<std::vector<SpecVersion>> SpecRegistry::List() { return specs_->ListSpecs(); }

Result<storage::SpecOwner> SpecRegistry::Claim(const std::string& name, const std::string& by) {
  return specs_->ClaimSpecName({name, by, false, clock_->NowMs()});
}

Result<storage::SpecOwner> SpecRegistry::Owner(const std::string& name) {
  return specs_->GetSpecOwner(name);
}

Result<std::vector<storage::SpecOwner>> SpecRegistry::Owners() { return specs_->ListSpecOwners(); }

Status SpecRegistry::SetShared(const std::string& name, bool shared) {
  return specs_->SetSpecShared(name, shared);
}

}  // namespace idem::server
