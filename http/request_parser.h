#pragma once
// RequestParser (internal): Beast's HTTP/1.1 request parser, filling an
// http::Request directly, with idem's bounds and refusals on top of Beast's:
//
// - header bytes (Beast's header_limit) and field lines (counted here): 431;
// - body bytes, whatever the coding (Beast's body_limit, checked on the
//   Content-Length before any body byte and on each chunk header before its
//   data, so nothing past the limit is buffered): 413;
// - conflicting Content-Length values (Beast: bad_content_length) and a
//   second Authorization field (here): 400.
// A request with neither Content-Length nor Transfer-Encoding has an empty
// body (RFC 9112 6.3), whatever its method.
//
// Thread safety: one parser per request, used on one connection's strand.

#include <boost/beast/http/basic_parser.hpp>

#include "http/message.h"
#include "http/options.h"

namespace idem::http {

class RequestParser final : public boost::beast::http::basic_parser<true> {
 public:
  explicit RequestParser(const ServerOptions& options);

  /// The request read so far (whole once is_done()).
  Request& request() { return request_; }
  /// The status a refusal of this parser's own checks calls for (400, 431),
  /// or 0 when the parser's error, if any, came from Beast.
  int refusal() const { return refusal_; }
  /// The field lines seen (header and trailer).
  size_t fields() const { return fields_; }

 private:
  using error_code = boost::beast::error_code;
  using string_view = boost::beast::string_view;

  void on_request_impl(boost::beast::http::verb method, string_view method_str, string_view target,
                       int version, error_code& ec) override;
  void on_response_impl(int, string_view, int, error_code&) override {}
  void on_field_impl(boost::beast::http::field name, string_view name_string, string_view value,
                     error_code& ec) override;
  void on_header_impl(error_code& ec) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         error_code& ec) override;
  std::size_t on_body_impl(string_view body, error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, string_view extensions, error_code& ec) override {}
  std::size_t on_chunk_body_impl(std::uint64_t remain, string_view body, error_code& ec) override;
  void on_finish_impl(error_code& ec) override {}

  const size_t max_fields_;
  const size_t max_body_;
  Request request_;
  size_t fields_ = 0;
  bool seen_authorization_ = false;
  int refusal_ = 0;
};

}  // namespace idem::http
