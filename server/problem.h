#pragma once
// Problem documents (RFC 9457) and request bodies: the server's one mapping
// of statuses to HTTP errors, and the checks every JSON body passes (media
// type, UTF-8, nesting depth). Internal to the server.
//
// Every problem is application/problem+json {type, title, status, detail}
// with type "urn:idem:problem:<name>"; the detail is made printable.

#include <optional>
#include <string>

#include "server/http.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::server {

inline constexpr const char* kProblemJson = "application/problem+json";

/// Writes a problem: `type` is the name after "urn:idem:problem:".
void Problem(HttpResponse& res, int status, const std::string& type, const std::string& title,
             const std::string& detail);
/// Problem with extension members (RFC 9457 section 3.2), an object merged
/// into the document; they cannot replace type, title, status or detail.
void Problem(HttpResponse& res, int status, const std::string& type, const std::string& title,
             const std::string& detail, const Json& extensions);

/// Writes `body` as application/json.
void SendJson(HttpResponse& res, int status, const Json& body);

/// The one mapping of engine and store statuses to HTTP: kInvalidArgument
/// 400, kNotFound 404, kConflict 409, kFailedPrecondition /
/// kIllegalTransition / kAborted 409, kUnavailable 503 (+ Retry-After),
/// anything else 500.
void ProblemFor(HttpResponse& res, const Status& s);

/// The problem for an error the HTTP library answers itself (no route 404,
/// body too large 413, target too long 414, 405, else an unreadable 400-ish
/// request), by `res.status`.
void ProblemForHttpError(HttpResponse& res);

/// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(const std::string& s);

/// The JSON body of `req`, or nullopt with a 415 (a media type other than
/// application/json or +json), 400 invalid-utf8, 400 json-too-deep (deeper
/// than `max_depth`) or 400 malformed-json problem in `res`. An empty body is
/// `empty` when given.
std::optional<Json> ReadJsonBody(const HttpRequest& req, HttpResponse& res, int max_depth,
                                 std::optional<Json> empty = std::nullopt);

}  // namespace idem::server
