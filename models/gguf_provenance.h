// What a model is, where it comes from and under which license: the general.* metadata of gguf-py's
// Keys.General (name, organization, basename, size_label, license, languages, tags, base_model.N.*),
// read from the model a GGUF export starts from, so the exported file keeps its source's provenance
// and names the fine-tune as llama.cpp's convert_hf_to_gguf.py does.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf.h"
#include "engine/gguf_writer.h"

namespace loom {

struct GgufProvenance {
  std::string name;                                     // general.name
  std::vector<std::pair<std::string, GgufValue>> keys;  // the other general.* keys, in writing order
};

// The general.* keys that describe the model itself (all of them but general.name, .architecture,
// .type, .file_type, .quantization_version and .alignment, which describe the file): from a .gguf
// file as they are; from a Hugging Face folder, its README.md's YAML front matter (license,
// license_name, license_link, language, tags, base_model) and config.json's _name_or_path (a Hub id
// "org/name" gives general.name and general.organization). general.name falls back to the file's or
// folder's name. A front matter that is not the simple `key: value` / `- item` YAML the Hub writes is
// read as far as it is.
absl::StatusOr<GgufProvenance> source_provenance(const std::string& model_path);

// The provenance of `source` fine-tuned with the adapter in `adapter_dir` (its folder name is the
// fine-tune's name; a checkpoint-N folder is named after its run folder too): general.finetune, the
// source as general.base_model.0.* (name, organization, version, repo_url), the source's license,
// languages, tags, basename and size_label kept; its own lineage, authorship and datasets dropped.
GgufProvenance finetune_provenance(const GgufProvenance& source, const std::string& adapter_dir);

// A Hugging Face README.md for a folder converted from GGUF `f`: YAML front matter with the keys
// the Hub reads (license, license_name, license_link, language, tags, base_model as "org/name"), then
// a title (general.name) and the other general.* keys as a list. "" when the file has none of them.
// source_provenance() reads the front matter back.
std::string gguf_model_card(const GgufFile& f);

// Adds the keys of p.keys the writer does not hold yet (general.name is add_gguf_model's).
void add_gguf_provenance(const GgufProvenance& p, GgufWriter& w);

// The top-level keys of a README.md's YAML front matter: "key: value" (quotes removed), "key: [a, b]"
// and "key:" followed by "- item" lines give lists; nested mappings are skipped. Empty when the text
// does not open with a "---" line.
std::vector<std::pair<std::string, std::vector<std::string>>> readme_front_matter(const std::string& text);

}  // namespace loom
