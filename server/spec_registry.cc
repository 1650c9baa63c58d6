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

}  // namespace idem::server
