#include "storage/high_water_mark.h"

#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>

#include "common/json_util.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem::storage {
namespace {

constexpr const char* kMagic = "idem-hwm";
constexpr int kFormat = 1;

Status SysError(const std::string& path, const char* what) {
  return Status::Internal(path + ": " + what + ": " + std::strerror(errno));
}

std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status SyncDir(const std::string& path) {
  const std::string dir = DirOf(path);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return SysError(dir, "open directory");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return SysError(dir, "fsync directory");
  return Status::Ok();
}

std::string Format(const JournalPosition& pos) {
  std::string line = std::string(kMagic) + " " + std::to_string(kFormat) + " " +
                     std::to_string(pos.seq) + " " + pos.identity;
  line.resize(HighWaterMark::kFileBytes - 1, ' ');
  line += '\n';
  return line;
}

// The mark in `text`, or nullopt when it is not one this build wrote.
std::optional<JournalPosition> Parse(const std::string& text) {
  std::istringstream in(text);
  std::string magic, identity, rest;
  int format = 0;
  int64_t seq = -1;
  if (!(in >> magic >> format >> seq >> identity)) return std::nullopt;
  if (magic != kMagic || format != kFormat || seq < 0 || in >> rest) return std::nullopt;
  return JournalPosition{seq, identity};
}

std::string Describe(const JournalPosition& p) {
  return "seq " + std::to_string(p.seq) + " (journal " +
         (p.identity == "-" ? std::string("empty") : p.identity.substr(0, 16)) + ")";
}

Status Regression(const std::string& db_path, const std::string& mark_path,
                  const JournalPosition& mark, const JournalPosition& found) {
  const bool other =
      mark.identity != "-" && found.identity != "-" && found.identity != mark.identity;
  std::string what = other ? "journal " + db_path + " is not the journal its high-water mark " +
                                 mark_path + " was written for (mark at " + Describe(mark) +
                                 ", journal at " + Describe(found) + ")"
                           : "journal " + db_path + " went back in time: it ends at " +
                                 Describe(found) + ", but it had committed up to seq " +
                                 std::to_string(mark.seq) + " (high-water mark " + mark_path + ")";
  return Status::FailedPrecondition(
      std::string(kJournalRegressionMessage) + what + ". Its WAL (" + db_path +
      "-wal) was lost or truncated, or the files were restored from "
      "an earlier copy; sagas driven from here could repeat effects or be missing. Nothing is "
      "driven or written until an operator decides: put the lost WAL back beside the database "
      "(stop every process first), or accept the journal as it is "
      "(idem journal accept-regression --as NAME --reason TEXT; sagas committed after it are "
      "lost, and their effects may have happened)");
}

}  // namespace

std::string JournalIdentity(int64_t first_seq, const std::string& saga_id) {
  return Sha256Hex(std::to_string(first_seq) + " " + saga_id).substr(0, 32);
}

HighWaterMark::HighWaterMark(std::string path, int fd, JournalPosition mark)
    : path_(std::move(path)), fd_(fd), mark_(std::move(mark)) {}

HighWaterMark::~HighWaterMark() {
  std::lock_guard<std::mutex> lock(mu_);
  if (unsynced_ > 0) (void)::fdatasync(fd_);
  ::close(fd_);
}

Result<std::unique_ptr<HighWaterMark>> HighWaterMark::Open(const std::string& db_path,
                                                           const JournalPosition& found) {
  const std::string path = db_path + ".hwm";
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno != ENOENT) return SysError(path, "open");
  if (fd < 0) {
    // No mark yet: a new journal, or one made before marks existed.
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == EEXIST) return Open(db_path, found);  // another process made it
    if (fd < 0) return SysError(path, "create");
    std::unique_ptr<HighWaterMark> hwm(new HighWaterMark(path, fd, found));
    std::lock_guard<std::mutex> lock(hwm->mu_);
    IDEM_RETURN_IF_ERROR(hwm->WriteLocked(found, /*sync=*/true));
    IDEM_RETURN_IF_ERROR(SyncDir(path));
    return hwm;
  }
  std::string text(kFileBytes, '\0');
  ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  if (n < 0) {
    Status s = SysError(path, "read");
    ::close(fd);
    return s;
  }
  text.resize(static_cast<size_t>(n));
  if (n == 0) {
    // Created by a process that died before writing it: as if absent.
    std::unique_ptr<HighWaterMark> hwm(new HighWaterMark(path, fd, found));
    std::lock_guard<std::mutex> lock(hwm->mu_);
    IDEM_RETURN_IF_ERROR(hwm->WriteLocked(found, /*sync=*/true));
    return hwm;
  }
  auto mark = Parse(text);
  std::unique_ptr<HighWaterMark> hwm(new HighWaterMark(path, fd, mark.value_or(JournalPosition{})));
  std::lock_guard<std::mutex> lock(hwm->mu_);
  if (!mark) {
    hwm->regression_ = Status::FailedPrecondition(
        std::string(kJournalRegressionMessage) + path +
        ": not a high-water mark this build of idem wrote; the journal " + db_path +
        " cannot be checked against it. Restore the mark, or accept the journal as it is "
        "(idem journal accept-regression --as NAME --reason TEXT)");
    return hwm;
  }
  const bool other =
      mark->identity != "-" && found.identity != "-" && found.identity != mark->identity;
  if (found.seq < mark->seq || other) {
    hwm->regression_ = Regression(db_path, path, *mark, found);
    return hwm;
  }
  if (found.seq > mark->seq || found.identity != mark->identity) {
    IDEM_RETURN_IF_ERROR(hwm->WriteLocked(found, /*sync=*/false));
  }
  return hwm;
}

Status HighWaterMark::regression() const {
  std::lock_guard<std::mutex> lock(mu_);
  return regression_;
}

JournalPosition HighWaterMark::mark() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mark_;
}

void HighWaterMark::Advance(const JournalPosition& now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!regression_.ok() || now.seq <= mark_.seq) return;
  // A failed write leaves the mark behind: a weaker check, never a wrong one.
  (void)WriteLocked(now, /*sync=*/false);
}

Status HighWaterMark::WriteLocked(const JournalPosition& pos, bool sync) {
  const std::string line = Format(pos);
  if (::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    return SysError(path_, "write");
  }
  mark_ = pos;
  if (sync || ++unsynced_ >= kSyncEvery) {
    if (::fdatasync(fd_) != 0) return SysError(path_, "fdatasync");
    unsynced_ = 0;
  }
  return Status::Ok();
}

Status HighWaterMark::Accept(const JournalPosition& found, const std::string& who,
                             const std::string& reason, int64_t now_ms) {
  if (who.empty()) return Status::InvalidArgument("accept-regression: who decides is required");
  if (reason.empty()) return Status::InvalidArgument("accept-regression: a reason is required");
  std::lock_guard<std::mutex> lock(mu_);
  if (regression_.ok()) {
    return Status::FailedPrecondition("journal is not behind its high-water mark " + path_ +
                                      " (at " + Describe(found) + "): nothing to accept");
  }
  const std::string log_path = path_ + ".log";
  Json entry = {{"at", FormatTimeMs(now_ms)},
                {"event", "regression_accepted"},
                {"by", who},
                {"reason", reason},
                {"mark_seq", mark_.seq},
                {"mark_journal", mark_.identity},
                {"found_seq", found.seq},
                {"found_journal", found.identity},
                {"found", regression_.message()}};
  const std::string line = entry.dump() + "\n";
  int fd = ::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return SysError(log_path, "open");
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
            ::fsync(fd) == 0;
  Status s = ok ? Status::Ok() : SysError(log_path, "write");
  ::close(fd);
  IDEM_RETURN_IF_ERROR(s);
  IDEM_RETURN_IF_ERROR(SyncDir(log_path));
  IDEM_RETURN_IF_ERROR(WriteLocked(found, /*sync=*/true));
  regression_ = Status::Ok();
  return Status::Ok();
}

}  // namespace idem::storage
