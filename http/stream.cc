#include "http/stream.h"

#include <string>
#include <utility>

#include "http/stream_state.h"

namespace idem::http {
namespace {

// `text` without CR and LF (an event name or id must stay on its line).
std::string OneLine(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c != '\r' && c != '\n') out.push_back(c);
  }
  return out;
}

// Appends "<field>: <line>\n" for every line of `text` (CRLF, CR or LF).
void AppendLines(std::string& out, std::string_view field, std::string_view text) {
  size_t start = 0;
  while (true) {
    size_t end = text.find_first_of("\r\n", start);
    out.append(field).append(": ").append(text.substr(start, end - start)).push_back('\n');
    if (end == std::string_view::npos) return;
    start = end + (text.compare(end, 2, "\r\n") == 0 ? 2 : 1);
  }
}

}  // namespace

std::string FormatEvent(std::string_view data, std::string_view event, std::string_view id) {
  std::string out;
  if (!event.empty()) out.append("event: ").append(OneLine(event)).push_back('\n');
  if (!id.empty()) out.append("id: ").append(OneLine(id)).push_back('\n');
  AppendLines(out, "data", data);
  out.push_back('\n');
  return out;
}

bool Stream::Send(std::string_view data, std::string_view event, std::string_view id) {
  return state_ != nullptr && state_->Send(FormatEvent(data, event, id));
}

bool Stream::Comment(std::string_view text) {
  if (state_ == nullptr) return false;
  std::string out;
  AppendLines(out, "", text);
  out.push_back('\n');
  return state_->Send(std::move(out));
}

void Stream::Close() {
  if (state_ != nullptr) state_->RequestClose();
}

bool Stream::open() const { return state_ != nullptr && state_->open(); }

void Stream::OnClose(std::function<void()> fn) {
  if (state_ == nullptr) {
    fn();
    return;
  }
  state_->OnClose(std::move(fn));
}

bool StreamState::Send(std::string bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ || closing_) return false;
  if (queued_ + bytes.size() > max_queued_) {
    closing_ = true;
    close_();
    return false;
  }
  queued_ += bytes.size();
  deliver_(std::move(bytes));
  return true;
}

void StreamState::RequestClose() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ || closing_) return;
  closing_ = true;
  close_();
}

void StreamState::Written(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  queued_ = n > queued_ ? 0 : queued_ - n;
}

void StreamState::MarkClosed() {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return;
    open_ = false;
    callbacks.swap(on_close_);
  }
  for (auto& fn : callbacks) fn();
}

bool StreamState::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

void StreamState::OnClose(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_) {
      on_close_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

}  // namespace idem::http
