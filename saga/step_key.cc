#include "saga/step_key.h"

#include <algorithm>
#include <utility>

#include "common/duration.h"

namespace idem {
namespace {

constexpr const char* kCompensateSuffix = ":compensate";

/// What a key template can render: any text that starts with `lead` and
/// ends with `tail` (the constants around its references), or exactly
/// `lead` when it has no reference.
struct KeyShape {
  std::string place;  ///< "steps[1].key", "steps[1].key (its compensation key)"
  std::string text;   ///< the template as written (with the suffix for compensation keys)
  size_t step = 0;
  bool constant = true;
  std::string lead, tail;
};

bool PrefixRelated(const std::string& a, const std::string& b) {
  size_t n = std::min(a.size(), b.size());
  return a.compare(0, n, b, 0, n) == 0;
}

bool SuffixRelated(const std::string& a, const std::string& b) {
  size_t n = std::min(a.size(), b.size());
  return a.compare(a.size() - n, n, b, b.size() - n, n) == 0;
}

bool StartsEnds(const std::string& text, const KeyShape& t) {
  return text.size() >= t.lead.size() + t.tail.size() && PrefixRelated(text, t.lead) &&
         SuffixRelated(text, t.tail);
}

/// Whether some rendering of `a` may equal some rendering of `b`, if every
/// reference may render any text.
bool MayCollide(const KeyShape& a, const KeyShape& b) {
  if (a.constant && b.constant) return a.lead == b.lead;
  if (a.constant) return StartsEnds(a.lead, b);
  if (b.constant) return StartsEnds(b.lead, a);
  return PrefixRelated(a.lead, b.lead) && SuffixRelated(a.tail, b.tail);
}

KeyShape ShapeOf(const std::vector<TemplatePiece>& pieces, std::string suffix) {
  KeyShape k;
  size_t first_ref = pieces.size(), last_ref = pieces.size();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i].is_ref) continue;
    if (first_ref == pieces.size()) first_ref = i;
    last_ref = i;
  }
  k.constant = first_ref == pieces.size();
  for (size_t i = 0; i < pieces.size() && i < first_ref; ++i) k.lead += pieces[i].text;
  if (!k.constant) {
    for (size_t i = last_ref + 1; i < pieces.size(); ++i) k.tail += pieces[i].text;
    k.tail += suffix;
  } else {
    k.lead += suffix;
  }
  return k;
}

std::string Quoted(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

std::string StepKey(const std::string& saga_id, const std::string& step_id) {
  return saga_id + "/" + step_id;
}

Status ParseStepKey(const Json& key, const std::string& where, StepSpec* step) {
  if (!key.is_string()) return Status::InvalidArgument(where + ": expected a string");
  const std::string& text = key.get_ref<const std::string&>();
  auto pieces = SplitTemplateText(text, where);
  if (!pieces.ok()) return pieces.status();
  for (const TemplatePiece& p : *pieces) {
    if (p.is_ref && p.text != "input" && p.text.rfind("input.", 0) != 0) {
      return Status::InvalidArgument(
          where + ": " + Quoted("${" + p.text + "}") +
          ": a key may reference only the input (${input...}) and constants: it must be known "
          "before the step's first call and stay the same on every attempt");
    }
  }
  step->key_template = text;
  return Status::Ok();
}

Status CheckKeyCollisions(const SagaSpec& spec) {
  std::vector<KeyShape> keys;
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    const StepSpec& s = spec.steps[i];
    if (s.key_template.empty()) continue;  // <saga id>/<step id>: unique per saga
    const std::string place = "steps[" + std::to_string(i) + "].key";
    auto pieces = SplitTemplateText(s.key_template, place);
    if (!pieces.ok()) return pieces.status();
    KeyShape k = ShapeOf(*pieces, "");
    k.place = place;
    k.text = s.key_template;
    k.step = i;
    keys.push_back(k);
    if (s.compensate) {
      KeyShape c = ShapeOf(*pieces, kCompensateSuffix);
      c.place = place + " (as its compensation key)";
      c.text = s.key_template + kCompensateSuffix;
      c.step = i;
      keys.push_back(c);
    }
  }
  for (size_t b = 0; b < keys.size(); ++b) {
    for (size_t a = 0; a < b; ++a) {
      // A key and its own compensation key differ by the suffix.
      if (keys[a].step == keys[b].step || !MayCollide(keys[a], keys[b])) continue;
      const bool same = keys[a].text == keys[b].text;
      return Status::InvalidArgument(
          keys[b].place + ": " + Quoted(keys[b].text) +
          (same ? " is the same template as " : " may render the same key as ") + keys[a].place +
          " (" + Quoted(keys[a].text) +
          "): keys of one saga must differ in their constant text (another prefix before the "
          "first ${...} or suffix after the last), since the values they reference may be equal");
    }
  }
  return Status::Ok();
}

Result<std::string> RenderStepKey(const SagaSpec& spec, size_t index, const std::string& saga_id,
                                  const Json& input) {
  const StepSpec& step = spec.steps.at(index);
  if (step.key_template.empty()) return StepKey(saga_id, step.id);
  const std::string where = "steps[" + std::to_string(index) + "].key";
  auto rendered = ResolveTemplates(Json(step.key_template), Json{{"input", input}}, where);
  if (!rendered.ok()) return rendered.status();
  std::string key;
  if (rendered->is_string()) {
    key = rendered->get<std::string>();
  } else if (rendered->is_number_integer()) {
    key = rendered->dump();
  } else {
    return Status::InvalidArgument(where + ": " + Quoted(step.key_template) + " renders " +
                                   rendered->type_name() + ", not text");
  }
  if (key.empty()) {
    return Status::InvalidArgument(where + ": " + Quoted(step.key_template) +
                                   " renders an empty key");
  }
  if (key.size() > kMaxStepKeyBytes) {
    return Status::InvalidArgument(where + ": " + Quoted(step.key_template) + " renders a key of " +
                                   std::to_string(key.size()) + " bytes (at most " +
                                   std::to_string(kMaxStepKeyBytes) + ")");
  }
  for (unsigned char c : key) {
    if (c < 0x21 || c > 0x7e) {
      return Status::InvalidArgument(
          where + ": " + Quoted(step.key_template) + " renders \"" + PrintableText(key) +
          "\": a key may hold printable ASCII only, no spaces (it travels in an HTTP header)");
    }
  }
  return key;
}

Status CheckStepKeys(const SagaSpec& spec, const Json& input) {
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    if (spec.steps[i].key_template.empty()) continue;
    auto key = RenderStepKey(spec, i, "", input);
    if (!key.ok()) return key.status();
  }
  return Status::Ok();
}

int64_t CompletionWindowMs(const ToolInfo& tool) {
  // An accepted call is asked about by its key until the window's end
  // (saga/completion.h); a resend after "not applied" reuses the key then.
  return tool.completion.accepts ? tool.completion.window_ms : 0;
}

std::vector<KeyWait> MaxWaitBeforeKeyReuse(const StepSpec& step, const ToolInfo& tool,
                                           const std::string& path) {
  std::vector<KeyWait> parts;
  if (step.approval != Approval::kNone) {
    parts.push_back({path + ".approval_ttl",
                     "approval_ttl " + FormatDurationMs(step.approval_ttl_ms),
                     step.approval_ttl_ms});
  }
  parts.push_back({path + ".retry", "retry horizon " + FormatDurationMs(step.retry.HorizonMs()),
                   step.retry.HorizonMs()});
  if (int64_t window = CompletionWindowMs(tool); window > 0) {
    parts.push_back({path + ".tool", "completion window " + FormatDurationMs(window), window});
  }
  return parts;
}

namespace {

Status CheckParts(const std::vector<KeyWait>& parts, const ToolInfo& tool, const char* whose) {
  if (tool.key_retention_ms <= 0 || parts.empty()) return Status::Ok();
  int64_t total = 0;
  const KeyWait* largest = &parts.front();
  std::string list;
  for (const KeyWait& w : parts) {
    total += w.ms;
    if (w.ms > largest->ms) largest = &w;
    list += (list.empty() ? "" : " + ") + w.what;
  }
  if (total <= tool.key_retention_ms) return Status::Ok();
  return Status::InvalidArgument(
      largest->place + ": " + whose + " key may be reused up to " + FormatDurationMs(total) +
      " after its first use (" + list + "), longer than tool " + Quoted(tool.name) +
      " keeps keys (key_retention " + FormatDurationMs(tool.key_retention_ms) +
      "): a reuse past it would be a new call to the provider; shorten the wait or use a tool "
      "that keeps keys longer");
}

}  // namespace

Status CheckKeyRetention(const StepSpec& step, const ToolRegistry& tools, const std::string& path) {
  if (const Tool* t = tools.Find(step.tool)) {
    IDEM_RETURN_IF_ERROR(
        CheckParts(MaxWaitBeforeKeyReuse(step, t->info(), path), t->info(), "the step's"));
  }
  if (step.compensate) {
    if (const Tool* c = tools.Find(step.compensate->tool)) {
      const std::string cpath = path + ".compensate.retry";
      std::vector<KeyWait> parts{
          {cpath, "retry horizon " + FormatDurationMs(step.compensate->retry.HorizonMs()),
           step.compensate->retry.HorizonMs()}};
      IDEM_RETURN_IF_ERROR(CheckParts(parts, c->info(), "the compensation's"));
    }
  }
  return Status::Ok();
}

}  // namespace idem
