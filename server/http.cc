#include "server/http.h"

#include <algorithm>
#include <cctype>

namespace idem::server {
namespace {

std::string FirstOf(const HttpHeaders& headers, const std::string& name) {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

}  // namespace

bool HeaderNameLess::operator()(const std::string& a, const std::string& b) const {
  return std::lexicographical_compare(
      a.begin(), a.end(), b.begin(), b.end(),
      [](unsigned char x, unsigned char y) { return std::tolower(x) < std::tolower(y); });
}

std::string HttpRequest::Header(const std::string& name) const { return FirstOf(headers, name); }

std::string HttpRequest::Param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}

void HttpResponse::SetHeader(const std::string& name, const std::string& value) {
  headers.erase(name);
  headers.emplace(name, value);
}

std::string HttpResponse::Header(const std::string& name) const { return FirstOf(headers, name); }

}  // namespace idem::server
