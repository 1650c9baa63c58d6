#include "mcp/stdio.h"

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace idem::mcp {
namespace {

class LineWriter {
 public:
  explicit LineWriter(std::FILE* out) : out_(out) {}
  void Write(const Message& m) {
    const std::string line = Encode(m) + "\n";
    std::lock_guard<std::mutex> lock(mu_);
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
  std::mutex mu_;
};

}  // namespace

size_t RunStdio(Session* session, std::istream& in, std::FILE* out, StdioOptions options) {
  LineWriter writer(out);
  const Session::Notify notify = [&writer](const Message& m) { writer.Write(m); };
  std::vector<std::thread> calls;
  size_t bad = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line.size() > options.max_line_bytes) {
      ++bad;
      writer.Write(Message::Error(
          std::nullopt, rpc_error::kParseError,
          "message longer than " + std::to_string(options.max_line_bytes) + " bytes"));
      continue;
    }
    auto decoded = Decode(line);
    if (auto* err = std::get_if<DecodeError>(&decoded)) {
      ++bad;
      writer.Write(Message::Error(err->id, err->error.code, err->error.message, err->error.data));
      continue;
    }
    Message m = std::get<Message>(std::move(decoded));
    if (m.is_request() && m.method == "tools/call") {
      calls.emplace_back([session, notify, &writer, m = std::move(m)] {
        auto answer = session->Handle(m, notify);
        if (answer) writer.Write(*answer);
      });
      continue;
    }
    auto answer = session->Handle(m, notify);
    if (answer) writer.Write(*answer);
  }
  for (std::thread& t : calls) t.join();
  return bad;
}

}  // namespace idem::mcp
