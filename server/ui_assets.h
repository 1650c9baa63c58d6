#pragma once
// The web UI's files (server/ui/: HTML, CSS, JavaScript), compiled into the
// binary by cmake/embed_files.cmake: nothing is read from disk at run time
// and nothing is fetched at build time.
//
// Thread safety: immutable.

#include <cstddef>
#include <string>
#include <vector>

namespace idem::server {

/// One embedded file, named by its path under server/ui ("app.js").
struct EmbeddedFile {
  const char* name;
  const unsigned char* data;
  size_t size;
};

/// Every file of server/ui (generated source).
const std::vector<EmbeddedFile>& UiAssets();

/// The file named `name`; nullptr when there is none.
const EmbeddedFile* FindUiAsset(const std::string& name);

/// The media type served for `name`, by its extension ("text/html;
/// charset=utf-8", "text/javascript; charset=utf-8", "text/css;
/// charset=utf-8", "image/svg+xml"); "application/octet-stream" otherwise.
std::string UiContentType(const std::string& name);

}  // namespace idem::server
