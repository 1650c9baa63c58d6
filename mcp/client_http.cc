#include "mcp/client_http.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include <httplib.h>

#include "tools/http_tls.h"

#include <openssl/err.h>

namespace idem::mcp {
namespace {

constexpr size_t kMaxBodyBytes = 8u << 20;

Status Bad(const std::string& place, const std::string& what) {
  return Status::InvalidArgument(place + ": " + what);
}

// Reads http(s)://host[:port][/path] into `c` (host, port, tls, base_path).
Status ParseUrl(const std::string& url, const std::string& place, HttpToolConfig* c) {
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    c->tls = true;
  } else {
    return Bad(place, "\"" + url + "\": expected http://HOST[:PORT]/PATH or https://...");
  }
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  if (authority.empty()) return Bad(place, "\"" + url + "\": no host");
  std::string host = authority, port;
  if (authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return Bad(place, "\"" + url + "\": unterminated [");
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return Bad(place, "\"" + url + "\": bad host");
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.find(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty() || authority.find('@') != std::string::npos) {
    return Bad(place, "\"" + url + "\": expected a host without user information");
  }
  c->host = host;
  c->port = c->tls ? 443 : 80;
  if (!port.empty()) {
    const bool digits = port.size() <= 5 && std::all_of(port.begin(), port.end(), ::isdigit);
    const int n = digits ? std::stoi(port) : 0;
    if (n < 1 || n > 65535) return Bad(place, "\"" + url + "\": the port must be in 1..65535");
    c->port = n;
  }
  if (path.find_first_of("#") != std::string::npos ||
      !std::all_of(path.begin(), path.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u > 0x20 && u < 0x7f;
      })) {
    return Bad(place, "\"" + url + "\": the path may not hold a fragment, spaces or non-ASCII");
  }
  c->base_path = path;
  return Status::Ok();
}

// Server-sent events, fed in chunks; calls `on_data` with each event's data
// whose type is "message" (the default).
class SseReader {
 public:
  template <typename F>
  void Feed(const char* data, size_t n, F&& on_data) {
    buf_.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = buf_.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) {
        if (has_data_ && (event_.empty() || event_ == "message")) on_data(data_);
        data_.clear();
        event_.clear();
        has_data_ = false;
        continue;
      }
      if (line[0] == ':') continue;  // a comment (keep-alive)
      const size_t colon = line.find(':');
      std::string field = line.substr(0, colon);
      std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (field == "data") {
        if (has_data_) data_ += '\n';
        data_ += value;
        has_data_ = true;
      } else if (field == "event") {
        event_ = value;
      }
    }
    buf_.erase(0, start);
  }
  size_t buffered() const { return buf_.size() + data_.size(); }

 private:
  std::string buf_, data_, event_;
  bool has_data_ = false;
};

class HttpTransport : public ClientTransport {
 public:
  HttpTransport(HttpToolConfig config, std::string url)
      : config_(std::move(config)), url_(std::move(url)) {}
  ~HttpTransport() override { Close(); }

  Status Start(TransportSinks sinks) override {
    sinks_ = std::move(sinks);
    return Status::Ok();
  }

  void SetProtocolVersion(const std::string& version) override {
    std::lock_guard<std::mutex> lock(mu_);
    protocol_version_ = version;
  }

  SendResult Send(const Message& message, int64_t timeout_ms) override {
    SendResult out;
    std::string session, version;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) {
        out.kind = SendResult::Kind::kNotSent;
        out.error = "the transport is closed";
        return out;
      }
      session = session_id_;
      version = protocol_version_;
    }
    http_tls::Client client(config_);
    httplib::ClientImpl& cli = client.get();
    cli.set_connection_timeout(config_.connect_timeout_ms / 1000,
                               (config_.connect_timeout_ms % 1000) * 1000);
    cli.set_read_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
    cli.set_write_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
    cli.set_keep_alive(false);
    cli.set_follow_location(false);
    if (!cli.is_valid()) {
      out.kind = SendResult::Kind::kNotSent;
      out.error = "cannot load the client certificate " + config_.client_cert + " and its key";
      return out;
    }
    httplib::Request req;
    req.method = "POST";
    req.path = config_.base_path;
    for (const auto& [name, value] : config_.headers) req.headers.emplace(name, value);
    req.headers.emplace("Accept", "application/json, text/event-stream");
    req.headers.emplace("Content-Type", "application/json");
    if (!session.empty()) req.headers.emplace("Mcp-Session-Id", session);
    if (!version.empty()) req.headers.emplace("MCP-Protocol-Version", version);
    req.body = Encode(message);

    const bool is_request = message.is_request();
    const RequestId sent_id = is_request ? *message.id : RequestId{int64_t{0}};
    bool sse = false, answered = false, too_large = false;
    int status = 0;
    std::string body;
    SseReader reader;
    auto deliver = [&](const std::string& text) {
      auto decoded = Decode(text);
      if (auto* m = std::get_if<Message>(&decoded)) {
        if (m->is_response() && m->id && *m->id == sent_id) answered = true;
        sinks_.on_message(*m);
      }
    };
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      sse = r.get_header_value("Content-Type").rfind("text/event-stream", 0) == 0;
      std::string sid = r.get_header_value("Mcp-Session-Id");
      if (!sid.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        session_id_ = sid;
      }
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (sse && status >= 200 && status < 300) {
        reader.Feed(data, n, deliver);
        if (reader.buffered() > kMaxBodyBytes) too_large = true;
        // The answer is in: stop reading (closing the stream is no cancel).
        return !too_large && !(is_request && answered);
      }
      if (body.size() + n > kMaxBodyBytes) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    };
    ERR_clear_error();
    httplib::Result res = cli.send(req);
    if (!res && !(is_request && answered)) {
      const httplib::Error e = res.error();
      http_tls::Failure tls = client.Classify(e);
      const bool never = e == httplib::Error::Connection ||
                         e == httplib::Error::ConnectionTimeout ||
                         e == httplib::Error::BindIPAddress || (tls.tls && tls.not_sent);
      out.kind = never ? SendResult::Kind::kNotSent : SendResult::Kind::kMaybeSent;
      out.error = too_large ? "an answer over 8 MiB (abandoned)"
                  : tls.tls ? tls.reason
                            : url_ + ": " + httplib::to_string(e);
      return out;
    }
    if (is_request && answered) return out;
    if (status >= 200 && status < 300) {
      if (!sse && !body.empty()) deliver(body);
      if (is_request && !answered) {
        out.kind = SendResult::Kind::kMaybeSent;
        out.error = "HTTP " + std::to_string(status) + " without an answer to the request";
      }
      return out;
    }
    // Not 2xx: a JSON-RPC error in the body says why (delivered as such).
    if (!body.empty()) deliver(body);
    if (is_request && answered) return out;
    out.kind =
        status >= 400 && status < 500 ? SendResult::Kind::kNotSent : SendResult::Kind::kMaybeSent;
    out.error =
        "HTTP " + std::to_string(status) +
        (status == 404 && !session.empty() ? " (the server ended session " + session + ")" : "");
    return out;
  }

  void Close() override {
    std::string session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      session = session_id_;
    }
    if (session.empty()) return;
    http_tls::Client client(config_);
    httplib::ClientImpl& cli = client.get();
    cli.set_connection_timeout(1, 0);
    cli.set_read_timeout(2, 0);
    httplib::Headers headers = {{"Mcp-Session-Id", session}};
    for (const auto& [name, value] : config_.headers) headers.emplace(name, value);
    if (cli.is_valid()) (void)cli.Delete(config_.base_path, headers);  // 405 is allowed
  }

  std::string Describe() const override { return "http upstream " + url_; }

 private:
  HttpToolConfig config_;  // host, port, tls, base_path (the endpoint), TLS files
  std::string url_;
  TransportSinks sinks_;
  std::mutex mu_;
  std::string session_id_;
  std::string protocol_version_;
  bool closed_ = false;
};

}  // namespace

Result<std::unique_ptr<ClientTransport>> NewHttpTransport(HttpTransportOptions options,
                                                          const std::string& place) {
  HttpToolConfig c;
  IDEM_RETURN_IF_ERROR(ParseUrl(options.url, place, &c));
  if (!c.tls && (!options.ca_file.empty() || !options.client_cert.empty())) {
    return Bad(place, "ca_file and client_cert are only allowed with an https URL");
  }
  c.ca_file = options.ca_file;
  c.client_cert = options.client_cert;
  c.client_key = options.client_key;
  c.headers = options.headers;
  c.connect_timeout_ms = options.connect_timeout_ms;
  return std::unique_ptr<ClientTransport>(new HttpTransport(std::move(c), options.url));
}

}  // namespace idem::mcp
