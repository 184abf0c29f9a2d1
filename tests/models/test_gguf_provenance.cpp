// Provenance of GGUF exports: the general.* keys of a source GGUF (license, organization, basename,
// size label, languages) written by add_gguf_model + add_gguf_provenance and read back with Loom's
// GGUF reader; a fine-tune named after its adapter folder with the source as general.base_model.0
// (gguf-py's Keys.General names); a Hugging Face folder's README front matter and config's
// _name_or_path read as the Hub writes them.
#include "models/gguf_provenance.h"

#include <gtest/gtest.h>

#include <fstream>

#include "models/gguf_export.h"
#include "nlohmann/json.hpp"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {

// The source: the qwen2 fixture written as a GGUF with the general.* keys SmolLM2's GGUF has.
std::string write_source(const test::TempDir& dir) {
  auto m = CausalLM::load(test::fixture_dir("qwen2"), {DType::f32, Device::cpu()});
  EXPECT_TRUE(m.ok()) << m.status();
  GgufWriter w;
  EXPECT_TRUE(add_gguf_model(**m, GgmlType::F32, "Smollm2 135M Instruct", w).ok());
  w.add("general.organization", gguf_string("HuggingFaceTB"));
  w.add("general.finetune", gguf_string("Instruct"));
  w.add("general.basename", gguf_string("smollm2"));
  w.add("general.size_label", gguf_string("135M"));
  w.add("general.license", gguf_string("apache-2.0"));
  w.add("general.languages", gguf_strings({"en", "fr"}));
  w.add("general.repo_url", gguf_string("https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"));
  const std::string path = dir.file("source.gguf");
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

// Exports `source` (with the provenance `p`) and reads the file back.
GgufFile export_with(const std::string& source, const GgufProvenance& p, const std::string& out) {
  auto m = CausalLM::load(source, {DType::f32, Device::cpu()});
  EXPECT_TRUE(m.ok()) << m.status();
  GgufWriter w;
  EXPECT_TRUE(add_gguf_model(**m, GgmlType::F16, p.name, w).ok());
  add_gguf_provenance(p, w);
  EXPECT_TRUE(w.write(out).ok());
  auto f = GgufFile::open(out);
  EXPECT_TRUE(f.ok()) << f.status();
  return *std::move(f);
}

std::string str(const GgufFile& f, const std::string& key) {
  auto v = f.get_string(key);
  return v.ok() ? *v : "<" + std::string(v.status().message()) + ">";
}

TEST(GgufProvenance, AnExportKeepsTheSourcesGeneralKeys) {
  test::TempDir dir;
  const std::string src = write_source(dir);
  auto p = source_provenance(src);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "Smollm2 135M Instruct");
  const GgufFile f = export_with(src, *p, dir.file("out.gguf"));
  EXPECT_EQ(str(f, "general.name"), "Smollm2 135M Instruct");
  EXPECT_EQ(str(f, "general.organization"), "HuggingFaceTB");
  EXPECT_EQ(str(f, "general.finetune"), "Instruct");
  EXPECT_EQ(str(f, "general.basename"), "smollm2");
  EXPECT_EQ(str(f, "general.size_label"), "135M");
  EXPECT_EQ(str(f, "general.license"), "apache-2.0");
  EXPECT_EQ(str(f, "general.repo_url"), "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct");
  EXPECT_EQ(*f.get_strings("general.languages"), (std::vector<std::string>{"en", "fr"}));
  // The file's own keys are the export's, once each (the reader rejects a duplicate key).
  EXPECT_EQ(str(f, "general.architecture"), "qwen2");
  EXPECT_EQ(*f.get_int("general.file_type"), 1);  // F16
}

TEST(GgufProvenance, AFineTuneIsNamedAfterItsAdapterWithTheSourceAsBaseModel) {
  test::TempDir dir;
  const std::string src = write_source(dir);
  auto p = source_provenance(src);
  ASSERT_TRUE(p.ok()) << p.status();
  const GgufProvenance ft = finetune_provenance(*p, "/runs/loom-persona/");
  const GgufFile f = export_with(src, ft, dir.file("ft.gguf"));
  EXPECT_EQ(str(f, "general.name"), "Smollm2 135M Instruct loom-persona");
  EXPECT_EQ(str(f, "general.finetune"), "loom-persona");
  EXPECT_EQ(*f.get_int("general.base_model.count"), 1);
  EXPECT_EQ(str(f, "general.base_model.0.name"), "Smollm2 135M Instruct");
  EXPECT_EQ(str(f, "general.base_model.0.organization"), "HuggingFaceTB");
  EXPECT_EQ(str(f, "general.base_model.0.repo_url"), "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct");
  EXPECT_EQ(str(f, "general.license"), "apache-2.0");
  EXPECT_EQ(str(f, "general.basename"), "smollm2");
  EXPECT_EQ(str(f, "general.size_label"), "135M");
  EXPECT_EQ(*f.get_strings("general.languages"), (std::vector<std::string>{"en", "fr"}));
  // Not the fine-tune's: the source's organization and URL (now its base model's).
  EXPECT_FALSE(f.has("general.organization"));
  EXPECT_FALSE(f.has("general.repo_url"));
  // A checkpoint folder is named with its run.
  EXPECT_EQ(finetune_provenance(*p, "out/run1/checkpoint-200").name, "Smollm2 135M Instruct run1-checkpoint-200");
}

TEST(GgufProvenance, AHuggingFaceFoldersReadmeAndConfig) {
  test::TempDir dir;
  std::filesystem::copy(test::fixture_dir("qwen2"), dir.path(), std::filesystem::copy_options::recursive);
  std::ifstream in(dir.file("config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct";
  std::ofstream(dir.file("config.json")) << config.dump();
  // As the Hub's model card for SmolLM2-135M-Instruct opens.
  std::ofstream(dir.file("README.md")) << "---\nlibrary_name: transformers\nlicense: apache-2.0\nlanguage:\n- en\n"
                                          "pipeline_tag: text-generation\ntags:\n- safetensors\n- onnx\n"
                                          "base_model:\n- HuggingFaceTB/SmolLM2-135M\n---\n\n# SmolLM2\n";
  auto p = source_provenance(dir.path());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "SmolLM2-135M-Instruct");
  const GgufFile f = export_with(dir.path(), *p, dir.file("hf.gguf"));
  EXPECT_EQ(str(f, "general.name"), "SmolLM2-135M-Instruct");
  EXPECT_EQ(str(f, "general.organization"), "HuggingFaceTB");
  EXPECT_EQ(str(f, "general.license"), "apache-2.0");
  EXPECT_EQ(*f.get_strings("general.languages"), (std::vector<std::string>{"en"}));
  EXPECT_EQ(*f.get_strings("general.tags"), (std::vector<std::string>{"safetensors", "onnx"}));
  EXPECT_EQ(*f.get_int("general.base_model.count"), 1);
  EXPECT_EQ(str(f, "general.base_model.0.name"), "SmolLM2-135M");
  EXPECT_EQ(str(f, "general.base_model.0.organization"), "HuggingFaceTB");
  EXPECT_EQ(str(f, "general.base_model.0.repo_url"), "https://huggingface.co/HuggingFaceTB/SmolLM2-135M");
  // Without README or _name_or_path: the folder's name.
  auto bare = source_provenance(test::fixture_dir("qwen2"));
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->name, "qwen2");
  EXPECT_TRUE(bare->keys.empty());
}

// loom convert's README.md: the Hub's keys in the front matter, which an export of the converted
// folder reads back.
TEST(GgufProvenance, AConvertedFoldersModelCardCarriesTheKeys) {
  test::TempDir dir;
  const std::string src = write_source(dir);
  auto f = GgufFile::open(src);
  ASSERT_TRUE(f.ok());
  const std::string card = gguf_model_card(*f);
  EXPECT_TRUE(card.starts_with("---\nlicense: \"apache-2.0\"\nlanguage:\n- \"en\"\n- \"fr\"\n---\n\n# Smollm2 135M Instruct\n"))
      << card;
  EXPECT_NE(card.find("- general.organization: HuggingFaceTB\n"), std::string::npos) << card;
  std::filesystem::create_directories(dir.file("hf"));
  std::ofstream(dir.file("hf/README.md")) << card;
  auto p = source_provenance(dir.file("hf"));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->keys.size(), 2u);
  EXPECT_EQ(p->keys[0].first, "general.license");
  EXPECT_EQ(p->keys[0].second.str, "apache-2.0");
  EXPECT_EQ(p->keys[1].first, "general.languages");
  ASSERT_EQ(p->keys[1].second.items.size(), 2u);
  EXPECT_EQ(p->keys[1].second.items[1].str, "fr");
  // A GGUF without provenance gets no model card.
  auto bare = GgufFile::open(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/tiny_qwen2.gguf");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(gguf_model_card(*bare), "");
}

TEST(GgufProvenance, FrontMatterAsYamlReadsIt) {
  const auto fm = readme_front_matter(
      "---\nlicense: \"mit\"\nlanguage: [en, 'de']\nmodel-index:\n  - name: x\n    results: []\n"
      "datasets:\n  - a/b\n  - c\n# a comment\nempty:\n---\nlicense: not front matter\n");
  using Entry = std::pair<std::string, std::vector<std::string>>;
  EXPECT_EQ(fm, (std::vector<Entry>{{"license", {"mit"}},
                                    {"language", {"en", "de"}},
                                    {"model-index", {"name: x"}},
                                    {"datasets", {"a/b", "c"}},
                                    {"empty", {}}}));
  EXPECT_TRUE(readme_front_matter("# A model card without front matter\nlicense: mit\n").empty());
}

}  // namespace
}  // namespace loom
