// Provenance metadata of GGUF exports (see gguf_provenance.h).
#include "models/gguf_provenance.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/json_file.h"
#include "nlohmann/json.hpp"
#include "models/gguf_model.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

// Keys that describe the file rather than the model: written by add_gguf_model.
const std::set<std::string> kFileKeys = {"general.name", "general.architecture", "general.type", "general.file_type",
                                         "general.quantization_version", "general.alignment"};

std::string unquote(std::string v) {
  v = std::string(absl::StripAsciiWhitespace(v));
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
  return v;
}

const GgufValue* find(const GgufProvenance& p, const std::string& key) {
  for (const auto& [k, v] : p.keys)
    if (k == key) return &v;
  return nullptr;
}

// A path's name without a trailing slash or a .gguf extension.
std::string stem_of(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p.extension() == ".gguf") p.replace_extension();
  return p.filename().string();
}

// A Hub id "org/name": {org, name}; a local path or a bare name: {"", last component}.
std::pair<std::string, std::string> hub_id(const std::string& id) {
  const std::vector<std::string> parts = absl::StrSplit(id, '/');
  if (parts.size() == 2 && !parts[0].empty() && !parts[1].empty() && parts[0] != "." && parts[0] != "..")
    return {parts[0], parts[1]};
  return {"", stem_of(id)};
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::string>>> readme_front_matter(const std::string& text) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || absl::StripTrailingAsciiWhitespace(line) != "---") return out;
  bool in_list = false;  // the last key had no inline value: "- item" lines belong to it
  while (std::getline(in, line)) {
    if (absl::StripTrailingAsciiWhitespace(line) == "---") break;
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty() || stripped.front() == '#') continue;
    if (stripped.front() == '-') {
      if (in_list) out.back().second.push_back(unquote(std::string(stripped.substr(1))));
      continue;
    }
    if (line.front() == ' ' || line.front() == '\t') continue;  // a nested mapping's line
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key(absl::StripAsciiWhitespace(line.substr(0, colon)));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    out.emplace_back(key, std::vector<std::string>{});
    in_list = value.empty();
    if (in_list) continue;
    if (value.front() == '[' && value.back() == ']') {
      for (absl::string_view item : absl::StrSplit(value.substr(1, value.size() - 2), ','))
        if (!absl::StripAsciiWhitespace(item).empty()) out.back().second.push_back(unquote(std::string(item)));
    } else {
      out.back().second.push_back(unquote(value));
    }
  }
  return out;
}

absl::StatusOr<GgufProvenance> source_provenance(const std::string& model_path) {
  GgufProvenance p;
  if (is_gguf_path(model_path)) {
    auto f = GgufFile::open(model_path);
    if (!f.ok()) return f.status();
    for (const GgufKv& kv : f->metadata())
      if (kv.key.starts_with("general.") && !kFileKeys.count(kv.key)) p.keys.emplace_back(kv.key, kv.value);
    if (auto name = f->get_string("general.name"); name.ok() && !name->empty()) p.name = *name;
  } else {
    const fs::path dir(model_path);
    std::error_code ec;
    if (fs::exists(dir / "config.json", ec)) {
      auto config = read_json_file((dir / "config.json").string());
      if (!config.ok()) return config.status();
      if (config->is_object() && config->contains("_name_or_path") && (*config)["_name_or_path"].is_string()) {
        const auto [org, name] = hub_id((*config)["_name_or_path"].get<std::string>());
        p.name = name;
        if (!org.empty()) p.keys.emplace_back("general.organization", gguf_string(org));
      }
    }
    if (std::ifstream readme(dir / "README.md"); readme) {
      std::stringstream text;
      text << readme.rdbuf();
      std::vector<std::string> bases;
      for (const auto& [key, values] : readme_front_matter(text.str())) {
        if (values.empty()) continue;
        if (key == "license") p.keys.emplace_back("general.license", gguf_string(values[0]));
        if (key == "license_name") p.keys.emplace_back("general.license.name", gguf_string(values[0]));
        if (key == "license_link") p.keys.emplace_back("general.license.link", gguf_string(values[0]));
        if (key == "language") p.keys.emplace_back("general.languages", gguf_strings(values));
        if (key == "tags") p.keys.emplace_back("general.tags", gguf_strings(values));
        if (key == "base_model") bases = values;
      }
      // As gguf-py's metadata does for a model card's base_model: name, organization, Hub URL.
      if (!bases.empty()) p.keys.emplace_back("general.base_model.count", gguf_u32(static_cast<uint32_t>(bases.size())));
      for (size_t i = 0; i < bases.size(); ++i) {
        const auto [org, name] = hub_id(bases[i]);
        const std::string k = absl::StrCat("general.base_model.", i, ".");
        p.keys.emplace_back(k + "name", gguf_string(name));
        if (org.empty()) continue;
        p.keys.emplace_back(k + "organization", gguf_string(org));
        p.keys.emplace_back(k + "repo_url", gguf_string(absl::StrCat("https://huggingface.co/", org, "/", name)));
      }
    }
  }
  if (p.name.empty()) p.name = stem_of(model_path);
  return p;
}

GgufProvenance finetune_provenance(const GgufProvenance& source, const std::string& adapter_dir) {
  fs::path dir = fs::path(adapter_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  std::string finetune = dir.filename().string();
  // run1/checkpoint-200: "run1-checkpoint-200" (a bare "checkpoint-200" says nothing of the run).
  if (finetune.starts_with("checkpoint-") && !dir.parent_path().filename().empty())
    finetune = absl::StrCat(dir.parent_path().filename().string(), "-", finetune);
  GgufProvenance p;
  p.name = absl::StrCat(source.name, " ", finetune);
  for (const char* key : {"general.basename", "general.size_label", "general.license", "general.license.name",
                          "general.license.link", "general.tags", "general.languages"})
    if (const GgufValue* v = find(source, key)) p.keys.emplace_back(key, *v);
  p.keys.emplace_back("general.finetune", gguf_string(finetune));
  p.keys.emplace_back("general.base_model.count", gguf_u32(1));
  p.keys.emplace_back("general.base_model.0.name", gguf_string(source.name));
  for (const char* field : {"organization", "version", "repo_url"})
    if (const GgufValue* v = find(source, absl::StrCat("general.", field)))
      p.keys.emplace_back(absl::StrCat("general.base_model.0.", field), *v);
  return p;
}

std::string gguf_model_card(const GgufFile& f) {
  auto text = [&](const std::string& key) -> std::string {
    auto v = f.get_string(key);
    return v.ok() ? *v : "";
  };
  auto list = [&](const std::string& key) -> std::vector<std::string> {
    auto v = f.get_strings(key);
    return v.ok() ? *v : std::vector<std::string>{};
  };
  // YAML double-quoted scalars: JSON string escapes are valid in them.
  auto quoted = [](const std::string& s) { return nlohmann::json(s).dump(); };
  std::string front;
  for (const auto& [key, yaml] : {std::pair{"general.license", "license"}, std::pair{"general.license.name", "license_name"},
                                  std::pair{"general.license.link", "license_link"}})
    if (const std::string v = text(key); !v.empty()) absl::StrAppend(&front, yaml, ": ", quoted(v), "\n");
  for (const auto& [key, yaml] : {std::pair{"general.languages", "language"}, std::pair{"general.tags", "tags"}})
    if (const auto v = list(key); !v.empty()) {
      absl::StrAppend(&front, yaml, ":\n");
      for (const std::string& item : v) absl::StrAppend(&front, "- ", quoted(item), "\n");
    }
  std::vector<std::string> bases;
  const int64_t count = f.get_int("general.base_model.count").value_or(0);
  for (int64_t i = 0; i < count && i < 64; ++i) {
    const std::string k = absl::StrCat("general.base_model.", i, ".");
    const std::string org = text(k + "organization"), name = text(k + "name");
    if (!name.empty()) bases.push_back(org.empty() ? name : absl::StrCat(org, "/", name));
  }
  if (!bases.empty()) {
    absl::StrAppend(&front, "base_model:\n");
    for (const std::string& b : bases) absl::StrAppend(&front, "- ", quoted(b), "\n");
  }
  std::string rest;
  for (const GgufKv& kv : f.metadata())
    if (kv.key.starts_with("general.") && !kFileKeys.count(kv.key) && kv.value.type == GgufType::kString)
      absl::StrAppend(&rest, "- ", kv.key, ": ", kv.value.str, "\n");
  if (front.empty() && rest.empty()) return "";
  const std::string name = text("general.name");
  return absl::StrCat("---\n", front, "---\n\n# ", name.empty() ? stem_of(f.path()) : name, "\n\nConverted from ",
                      fs::path(f.path()).filename().string(), " by `loom convert`. Its GGUF metadata:\n\n", rest);
}

void add_gguf_provenance(const GgufProvenance& p, GgufWriter& w) {
  for (const auto& [key, value] : p.keys)
    if (!w.has(key)) w.add(key, value);  // a front matter may repeat a key: the first one wins
}

}  // namespace loom
