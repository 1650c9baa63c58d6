#include "http/request_parser.h"

#include <algorithm>
#include <limits>

#include <boost/beast/http/error.hpp>

namespace idem::http {

namespace bhttp = boost::beast::http;

RequestParser::RequestParser(const ServerOptions& options)
    : max_fields_(options.max_header_fields), max_body_(options.max_body_bytes) {
  header_limit(static_cast<std::uint32_t>(
      std::min<size_t>(options.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
  body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
}

void RequestParser::on_request_impl(bhttp::verb, string_view method_str, string_view target,
                                    int version, error_code&) {
  request_.method.assign(method_str.data(), method_str.size());
  request_.target.assign(target.data(), target.size());
  std::string_view t(target.data(), target.size());
  size_t q = t.find('?');
  request_.path = PercentDecode(t.substr(0, q), false);
  request_.query = q == std::string_view::npos ? std::string() : std::string(t.substr(q + 1));
  request_.params = ParseQuery(request_.query);
  request_.version = version;
}

void RequestParser::on_field_impl(bhttp::field name, string_view name_string, string_view value,
                                  error_code& ec) {
  if (++fields_ > max_fields_) {
    refusal_ = 431;
    ec = bhttp::error::header_limit;
    return;
  }
  if (name == bhttp::field::authorization) {
    if (seen_authorization_) {
      refusal_ = 400;
      ec = bhttp::error::bad_field;
      return;
    }
    seen_authorization_ = true;
  }
  request_.headers.emplace(std::string(name_string.data(), name_string.size()),
                           std::string(value.data(), value.size()));
}

void RequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                      error_code&) {
  // Beast has already refused a Content-Length over the limit.
  if (content_length) request_.body.reserve(static_cast<size_t>(*content_length));
}

std::size_t RequestParser::on_body_impl(string_view body, error_code& ec) {
  if (request_.body.size() + body.size() > max_body_) {
    ec = bhttp::error::body_limit;
    return 0;
  }
  request_.body.append(body.data(), body.size());
  return body.size();
}

std::size_t RequestParser::on_chunk_body_impl(std::uint64_t, string_view body, error_code& ec) {
  return on_body_impl(body, ec);
}

}  // namespace idem::http
