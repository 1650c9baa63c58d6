#include "mcp/protocol.h"

#include <algorithm>

namespace idem::mcp {

const std::vector<std::string>& SupportedProtocolVersions() {
  static const std::vector<std::string> kVersions = {"2025-11-25", "2025-06-18", "2025-03-26"};
  return kVersions;
}

bool IsSupportedProtocolVersion(const std::string& version) {
  const auto& all = SupportedProtocolVersions();
  return std::find(all.begin(), all.end(), version) != all.end();
}

std::string NegotiateProtocolVersion(const std::string& requested) {
  return IsSupportedProtocolVersion(requested) ? requested : kLatestProtocolVersion;
}

const char* ServerVersion() {
#ifdef IDEM_VERSION_TEXT
  return IDEM_VERSION_TEXT;
#else
  return "0.1.0";
#endif
}

}  // namespace idem::mcp
