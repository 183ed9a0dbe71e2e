#include "common/job_spec.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace chorus {
namespace {

using v1::JobSpec;

// ---------------------------------------------------------------- parsing

class CollectingErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // The parser counts from 0; people count from 1.
    errors_.push_back(absl::StrCat(line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::vector<std::string> errors_;
};

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

bool LooksLikeJsonNumber(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  // strtod accepts forms JSON does not ("inf", "0x10", ".5", "5."): be strict.
  size_t i = (s[0] == '-') ? 1 : 0;
  if (i >= s.size() || !absl::ascii_isdigit(s[i])) return false;
  for (char c : s) {
    if (!(absl::ascii_isdigit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E')) {
      return false;
    }
  }
  return s.back() != '.';
}

// Note [YAML aliases]
// An alias (*name) is the very node its anchor (&name) marks, not a copy, so
// a YAML document is a graph: "a: &x [*x]" holds itself, and ten aliases of
// ten aliases of ... are a few hundred bytes that stand for gigabytes. The
// walk to JSON below refuses a node inside itself (naming the path), nesting
// deeper than any spec has (kMaxYamlDepth), and JSON beyond
// kMaxYamlExpansionBytes, before it would use the stack or memory up. Aliases
// a spec uses as meant (one env shared by two places) pass.
constexpr int kMaxYamlDepth = 64;
constexpr size_t kMaxYamlExpansionBytes = 4 * kMaxJobSpecBytes;

// A YAML document being written out as JSON.
struct YamlWalk {
  std::string json;
  std::vector<YAML::Node> open;  // the nodes the walk is inside, outermost first
};

absl::Status YamlNodeToJson(const YAML::Node& node, const std::string& path, YamlWalk& walk);

std::string YamlWhere(const std::string& path) { return path.empty() ? "top level" : path; }

void YamlScalarToJson(const YAML::Node& node, std::string& out) {
  const std::string& v = node.Scalar();
  if (node.Tag() == "!") {  // quoted
    out += JsonQuote(v);
  } else if (v == "true" || v == "false") {
    out += v;
  } else if (v == "~" || v == "null") {
    out += "null";
  } else if (LooksLikeJsonNumber(v)) {
    out += v;
  } else {
    out += JsonQuote(v);
  }
}

absl::Status YamlChildrenToJson(const YAML::Node& node, const std::string& path, YamlWalk& walk) {
  std::string& out = walk.json;
  if (node.IsSequence()) {
    out += "[";
    for (size_t i = 0; i < node.size(); ++i) {
      if (i > 0) out += ",";
      RETURN_IF_ERROR(YamlNodeToJson(node[i], absl::StrCat(path, "[", i, "]"), walk));
    }
    out += "]";
    return absl::OkStatus();
  }
  out += "{";
  bool first = true;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat(YamlWhere(path), ": map keys must be field names"));
    }
    const std::string key = kv.first.Scalar();
    if (!first) out += ",";
    first = false;
    out += JsonQuote(key);
    out += ":";
    RETURN_IF_ERROR(YamlNodeToJson(kv.second, path.empty() ? key : absl::StrCat(path, ".", key),
                                   walk));
  }
  out += "}";
  return absl::OkStatus();
}

absl::Status YamlNodeToJson(const YAML::Node& node, const std::string& path, YamlWalk& walk) {
  if (walk.json.size() > kMaxYamlExpansionBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        YamlWhere(path), ": the spec's aliases expand it past ", kMaxYamlExpansionBytes >> 20,
        " MiB (the largest spec is ", kMaxJobSpecBytes >> 10,
        " KiB); write the fields out or use fewer aliases of aliases"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      walk.json += "null";
      return absl::OkStatus();
    case YAML::NodeType::Scalar:
      YamlScalarToJson(node, walk.json);
      return absl::OkStatus();
    case YAML::NodeType::Sequence:
    case YAML::NodeType::Map:
      break;
  }
  for (const YAML::Node& outer : walk.open) {
    if (outer.is(node)) {
      return absl::InvalidArgumentError(absl::StrCat(
          YamlWhere(path), ": an alias refers to a node that contains it (a spec is a tree)"));
    }
  }
  if (walk.open.size() >= kMaxYamlDepth) {
    return absl::InvalidArgumentError(absl::StrCat(YamlWhere(path), ": nested more than ",
                                                   kMaxYamlDepth, " levels deep"));
  }
  walk.open.push_back(node);
  absl::Status s = YamlChildrenToJson(node, path, walk);
  walk.open.pop_back();
  return s;
}

// Converts a YAML document to JSON so that protobuf's JSON parser (which knows
// field names, enums and unknown-field checking) does the rest. Quoted
// scalars stay strings; plain scalars become numbers, booleans or null when
// they look like one. Note [YAML aliases].
absl::StatusOr<std::string> YamlToJson(const YAML::Node& root) {
  YamlWalk walk;
  RETURN_IF_ERROR(YamlNodeToJson(root, "", walk));
  return std::move(walk.json);
}

absl::StatusOr<JobSpec> ParseJson(absl::string_view json, absl::string_view source) {
  JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(std::string(json), &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec ", source, ": ", status.message().as_string()));
  }
  return spec;
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF).
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// The path of the first string field of `m` (in field order, depth first)
// that is not UTF-8, such as "strategy.ddp.ignored[1]"; empty if none.
std::string FirstNonUtf8Field(const google::protobuf::Message& m, const std::string& prefix) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (!f->is_repeated()) {
        if (!IsUtf8(r->GetString(m, f))) return path;
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        if (!IsUtf8(r->GetRepeatedString(m, f, i))) return absl::StrCat(path, "[", i, "]");
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        std::string bad = FirstNonUtf8Field(r->GetMessage(m, f), path);
        if (!bad.empty()) return bad;
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        std::string bad =
            FirstNonUtf8Field(r->GetRepeatedMessage(m, f, i), absl::StrCat(path, "[", i, "]"));
        if (!bad.empty()) return bad;
      }
    }
  }
  return "";
}

absl::StatusOr<JobSpec> ParseFormat(absl::string_view text, SpecFormat format,
                                    absl::string_view source);

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text, SpecFormat format,
                                     absl::string_view source) {
  ASSIGN_OR_RETURN(JobSpec spec, ParseFormat(text, format, source));
  // Proto3 strings are UTF-8: a spec holding other bytes could not be sent
  // to the coordinator (serialization refuses it) nor printed as JSON.
  if (const std::string bad = FirstNonUtf8Field(spec, ""); !bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec ", source, ": ", bad, ": is not valid UTF-8 text"));
  }
  return spec;
}

absl::StatusOr<SpecFormat> SpecFormatFromPath(absl::string_view path) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".textproto") || absl::EndsWith(lower, ".pbtxt") ||
      absl::EndsWith(lower, ".txtpb")) {
    return SpecFormat::kTextProto;
  }
  if (absl::EndsWith(lower, ".json")) return SpecFormat::kJson;
  if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) {
    return SpecFormat::kYaml;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "job spec ", path, ": unknown format; use a .textproto/.pbtxt, .json or .yaml/.yml file"));
}

namespace {

absl::StatusOr<JobSpec> ParseFormat(absl::string_view text, SpecFormat format,
                                    absl::string_view source) {
  switch (format) {
    case SpecFormat::kTextProto: {
      JobSpec spec;
      CollectingErrors errors;
      google::protobuf::TextFormat::Parser parser;
      parser.RecordErrorsTo(&errors);
      parser.AllowUnknownField(false);
      parser.AllowUnknownExtension(false);
      if (!parser.ParseFromString(std::string(text), &spec)) {
        std::vector<std::string> lines;
        for (const std::string& e : errors.errors()) {
          lines.push_back(absl::StrCat("job spec ", source, ":", e));
        }
        if (lines.empty()) lines.push_back(absl::StrCat("job spec ", source, ": cannot be parsed"));
        return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
      }
      return spec;
    }
    case SpecFormat::kJson:
      return ParseJson(text, source);
    case SpecFormat::kYaml: {
      YAML::Node root;
      try {
        root = YAML::Load(std::string(text));
      } catch (const YAML::Exception& e) {
        return absl::InvalidArgumentError(absl::StrCat("job spec ", source, ":", e.mark.line + 1,
                                                       ":", e.mark.column + 1, ": ", e.msg));
      }
      if (root.IsNull()) return JobSpec();
      if (!root.IsMap()) {
        return absl::InvalidArgumentError(
            absl::StrCat("job spec ", source, ": the top level must be a mapping of fields"));
      }
      absl::StatusOr<std::string> json = YamlToJson(root);
      if (!json.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("job spec ", source, ": ", json.status().message()));
      }
      return ParseJson(*json, source);
    }
  }
  return absl::InternalError("unknown spec format");
}

}  // namespace

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path,
                                    const std::string& program_working_dir) {
  ASSIGN_OR_RETURN(SpecFormat format, SpecFormatFromPath(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("job spec ", path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(buffer.str(), format, path));
  if (spec.has_program() && spec.program().working_dir().empty()) {
    spec.mutable_program()->set_working_dir(program_working_dir);
  }
  NormalizeJobSpec(spec);
  RETURN_IF_ERROR(CheckJobSpec(spec, path));
  return spec;
}

std::string JobSpecToText(const JobSpec& spec) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(spec, &out);
  return out;
}

std::string JobSpecToJson(const JobSpec& spec) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &out, options);
  return out;
}

}  // namespace chorus
