#pragma once
// Checks HTTP answers against server/openapi.json: the status is declared
// for the operation, the content type is declared, and the body has the
// required fields and types of its schema (a subset of OpenAPI 3.0: $ref,
// allOf, type, nullable, enum, required, properties, items). Tests that talk
// to a real server over loopback share it.

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <httplib.h>

#include "common/json_util.h"

namespace idem::test {

class OpenApiCheck {
 public:
  OpenApiCheck() {
    std::ifstream in(std::string(IDEM_SOURCE_DIR) + "/server/openapi.json");
    doc_ = Json::parse(in);
  }

  // Checks a response of `method` on `path` (the template, as in the
  // document) against the document. Returns the body as JSON (null for
  // non-JSON bodies).
  Json Check(const std::string& method, const std::string& path, const httplib::Result& r) {
    Json body;
    if (!r) {
      ADD_FAILURE() << method << " " << path << ": no response (" << httplib::to_string(r.error())
                    << ")";
      return body;
    }
    const Json& paths = doc_["paths"];
    if (!paths.contains(path) || !paths[path].contains(method)) {
      ADD_FAILURE() << method << " " << path << ": not in openapi.json";
      return body;
    }
    const Json& responses = paths[path][method]["responses"];
    std::string status = std::to_string(r->status);
    if (!responses.contains(status)) {
      ADD_FAILURE() << method << " " << path << ": status " << status
                    << " is not declared; body: " << r->body;
      return body;
    }
    Json resp = Resolve(responses[status]);
    std::string ct = r->get_header_value("Content-Type");
    ct = ct.substr(0, ct.find(';'));
    if (!resp.contains("content")) return body;
    if (!resp["content"].contains(ct)) {
      ADD_FAILURE() << method << " " << path << " " << status << ": content type \"" << ct
                    << "\" not declared";
      return body;
    }
    const Json& schema = resp["content"][ct]["schema"];
    if (ct == "text/plain") return body;
    try {
      body = Json::parse(r->body);
    } catch (const std::exception& e) {
      ADD_FAILURE() << method << " " << path << ": body is not JSON: " << r->body;
      return body;
    }
    std::string err = Validate(body, schema, "body");
    if (!err.empty()) ADD_FAILURE() << method << " " << path << " " << status << ": " << err;
    return body;
  }

 private:
  Json Resolve(const Json& j) const {
    if (!j.is_object() || !j.contains("$ref")) return j;
    std::string ref = j["$ref"].get<std::string>().substr(1);  // "/components/..."
    return Resolve(doc_.at(Json::json_pointer(ref)));
  }

  std::string Validate(const Json& v, const Json& schema_in, const std::string& at) const {
    Json schema = Resolve(schema_in);
    if (schema.contains("allOf")) {
      for (const Json& s : schema["allOf"]) {
        std::string e = Validate(v, s, at);
        if (!e.empty()) return e;
      }
    }
    if (v.is_null() && schema.value("nullable", false)) return "";
    if (schema.contains("type")) {
      std::string t = schema["type"];
      bool ok = (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
                (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
                (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean());
      if (!ok) return at + ": expected " + t + ", got " + v.dump();
    }
    if (schema.contains("enum")) {
      bool found = false;
      for (const Json& e : schema["enum"]) found = found || e == v;
      if (!found) return at + ": " + v.dump() + " not in the enum";
    }
    if (v.is_object()) {
      for (const Json& r : schema.value("required", Json::array())) {
        if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.dump();
      }
      const Json props = schema.value("properties", Json::object());
      for (auto it = props.begin(); it != props.end(); ++it) {
        if (!v.contains(it.key())) continue;
        std::string e = Validate(v.at(it.key()), it.value(), at + "." + it.key());
        if (!e.empty()) return e;
      }
    }
    if (v.is_array() && schema.contains("items")) {
      for (size_t i = 0; i < v.size(); ++i) {
        std::string e = Validate(v[i], schema["items"], at + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
    }
    return "";
  }

  Json doc_;
};

}  // namespace idem::test
