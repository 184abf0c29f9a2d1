// `loom convert --gguf`: the folder it writes loads as a Hugging Face model whose logits equal the
// .gguf loaded directly (f32 exactly; bf16 weights within bf16 rounding), with tokenizer files when
// the GGUF has a byte-level or SentencePiece vocabulary (the latter encoding as transformers does
// from the same GGUF), SentencePiece-style tokenizers through `loom export` and back, and clear errors
// for bad flags and files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "models/causal_lm.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"
#include "text/chat_template.h"
#include "text/gguf_tokenizer.h"
#include "text/tokenizer.h"
#include "engine/tensor_io.h"

namespace loom {
namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/";

std::vector<float> logits(const std::string& model, DType dtype) {
  auto m = CausalLM::load(model, {dtype, Device::cpu()});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  return (*m)->forward(Tensor::from_ints({1, 4, 9, 16, 25, 36, 49, 2}, {1, 8})).value().to_floats();
}

TEST(Convert, F32FolderGivesTheSameLogitsAsTheGguf) {
  test::TempDir dir("loom_convert");
  const std::string out = dir.file("hf");
  auto r = test::run_loom("convert --gguf " + kDir + "tiny_llama.gguf --out " + out + " --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  std::ifstream gc(out + "/generation_config.json");
  const auto g = nlohmann::json::parse(gc);
  EXPECT_EQ(g["eos_token_id"], 2);
  EXPECT_EQ(logits(out, DType::f32), logits(kDir + "tiny_llama.gguf", DType::f32));
}

TEST(Convert, Bf16FolderIsTheRoundedWeights) {
  test::TempDir dir("loom_convert");
  const std::string out = dir.file("hf");
  auto r = test::run_loom("convert --gguf " + kDir + "tiny_qwen2.gguf --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no tokenizer files written"), std::string::npos) << r.output;  // none in that file
  std::ifstream cf(out + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf)["torch_dtype"], "bfloat16");
  // Loading either as bf16 rounds the same f32 weights once: identical logits.
  EXPECT_EQ(logits(out, DType::bf16), logits(kDir + "tiny_qwen2.gguf", DType::bf16));
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

// SentencePiece ("llama") GGUFs: the folder's tokenizer files are the GGUF's converted tokenizer,
// and they encode and render the chat template as transformers does from the GGUF
// (tests/fixtures/gguf/spm_*.reference.json, tools/reference/make_gguf_spm_reference.py).
TEST(Convert, SentencePieceTokenizerFiles) {
  for (const auto& [name, tokenizer_class] : {std::pair{"spm_llama", "LlamaTokenizer"}, std::pair{"spm_gemma", "GemmaTokenizer"}}) {
    SCOPED_TRACE(name);
    test::TempDir dir("loom_convert");
    const std::string out = dir.file("hf"), gguf = kDir + name + ".gguf";
    auto r = test::run_loom("convert --gguf " + gguf + " --out " + out + " --dtype f32");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
    auto f = GgufFile::open(gguf);
    ASSERT_TRUE(f.ok()) << f.status();
    auto files = gguf_hf_tokenizer(*f);
    ASSERT_TRUE(files.ok()) << files.status();
    EXPECT_EQ(read_json(out + "/tokenizer.json"), files->tokenizer_json);
    const auto config = read_json(out + "/tokenizer_config.json");
    EXPECT_EQ(config, files->tokenizer_config_json);
    EXPECT_EQ(config["tokenizer_class"], tokenizer_class);

    const auto ref = read_json(kDir + name + ".reference.json");
    auto tok = Tokenizer::load(out);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const auto& c : ref["cases"])
      EXPECT_EQ(tok->encode(c["text"].get<std::string>(), c["add_special_tokens"].get<bool>()),
                c["ids"].get<std::vector<int32_t>>())
          << c["text"];
    auto tmpl = detect_chat_template(out);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    for (const auto& chat : ref["chats"]) {
      std::vector<ChatMessage> messages;
      for (const auto& m : chat["messages"]) messages.push_back({m["role"], m["content"]});
      auto rendered = tmpl->render(messages, true);
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(rendered->text, chat["text"].get<std::string>());
    }
    // The model in the same file loads from the folder with the logits of the GGUF itself.
    EXPECT_EQ(logits(out, DType::f32), logits(gguf, DType::f32));
  }
}

// Gemma 3 through llama.cpp's gemma3 and back with the CLI: `loom export` (the adapter merged) of
// the fixture changed so that gemma3 holds it, given tiny_llama's tokenizer (66 ids fit its 128),
// then `loom convert`: a Gemma3ForCausalLM config.json with what llama.cpp runs, whose model gives
// the .gguf's logits. The fixture as it is (a full second layer) is refused, naming the field.
TEST(Convert, Gemma3ExportAndBack) {
  test::TempDir dir("loom_convert_gemma3");
  ASSERT_EQ(test::run_loom("convert --gguf " + kDir + "tiny_llama.gguf --out " + dir.file("tiny") + " --dtype f32").exit_code, 0);
  const std::string src = dir.file("src"), gguf = dir.file("g.gguf"), back = dir.file("back");
  std::filesystem::create_directory(src);
  test::copy_fixture("gemma3", src, test::gemma3_llama_cpp_patch());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(dir.file("tiny") + "/" + f, src + "/" + f);
  const std::string adapter = test::fixture_dir("gemma3") + "/adapter";
  auto r = test::run_loom("export --model " + src + " --adapter " + adapter + " --out " + gguf + " --type f16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  r = test::run_loom("convert --gguf " + gguf + " --out " + back + " --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto c = read_json(back + "/config.json");
  EXPECT_EQ(c["model_type"], "gemma3_text");
  EXPECT_EQ(c["architectures"], nlohmann::json({"Gemma3ForCausalLM"}));
  EXPECT_EQ(c["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention"}));
  EXPECT_EQ(c["sliding_window"], 4);
  EXPECT_EQ(c["sliding_window_pattern"], 6);
  EXPECT_EQ(c["rope_theta"], 1e6);
  EXPECT_EQ(c["rope_scaling"], nlohmann::json({{"rope_type", "linear"}, {"factor", 8.0}}));
  EXPECT_EQ(c["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(c["query_pre_attn_scalar"], 16);
  EXPECT_EQ(c["head_dim"], 16);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(c["rms_norm_eps"], 1e-6);
  EXPECT_EQ(logits(back, DType::f32), logits(gguf, DType::f32));
  // The merge is in the file: the source's logits with the adapter differ from those without.
  EXPECT_NE(logits(back, DType::f32), logits(src, DType::f32));

  const std::string as_is = test::fixture_dir("gemma3");
  r = test::run_loom("export --model " + as_is + " --out " + dir.file("x.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("llama.cpp's gemma3 cannot hold this model: layer_types[1] is full_attention"),
            std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.gguf")));
}

// Mixtral and Qwen3-MoE through llama.cpp's llama / qwen3moe and back with the CLI: the folder has the
// source's config keys (qwen3_moe as llama.cpp computes it: norm_topk_prob true) and its hub
// checkpoint, the per-expert tensors by name, and gives the .gguf's logits. The qwen3_moe fixture as
// it is (norm_topk_prob false) is refused, naming the field.
TEST(Convert, MoeExportAndBack) {
  test::TempDir dir("loom_convert_moe");
  ASSERT_EQ(test::run_loom("convert --gguf " + kDir + "tiny_llama.gguf --out " + dir.file("tiny") + " --dtype f32").exit_code, 0);
  for (const std::string family : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(family);
    const std::string src = dir.file(family), gguf = dir.file(family + ".gguf"), back = dir.file(family + "_back");
    std::filesystem::create_directory(src);
    test::copy_fixture(family, src, family == "qwen3_moe" ? nlohmann::json{{"norm_topk_prob", true}} : nlohmann::json::object());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(dir.file("tiny") + "/" + f, src + "/" + f);
    auto r = test::run_loom("export --model " + src + " --out " + gguf + " --type f16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
    r = test::run_loom("convert --gguf " + gguf + " --out " + back + " --dtype f32");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto c = read_json(back + "/config.json");
    EXPECT_EQ(c["model_type"], family);
    EXPECT_EQ(c["num_experts_per_tok"], 2);
    if (family == "mixtral") {
      EXPECT_EQ(c["architectures"], nlohmann::json({"MixtralForCausalLM"}));
      EXPECT_EQ(c["num_local_experts"], 4);
      EXPECT_EQ(c["intermediate_size"], 48);
    } else {
      EXPECT_EQ(c["architectures"], nlohmann::json({"Qwen3MoeForCausalLM"}));
      EXPECT_EQ(c["num_experts"], 4);
      EXPECT_EQ(c["moe_intermediate_size"], 48);
      EXPECT_EQ(c["intermediate_size"], 96);
      EXPECT_EQ(c["norm_topk_prob"], true);
    }
    std::set<std::string> want, got;
    for (const auto& [name, t] : test::read_all(src + "/model.safetensors")) want.insert(name);
    for (const auto& [name, t] : test::read_all(back + "/model.safetensors")) got.insert(name);
    EXPECT_EQ(got, want);
    EXPECT_EQ(logits(back, DType::f32), logits(gguf, DType::f32));
  }
  auto r = test::run_loom("export --model " + test::fixture_dir("qwen3_moe") + " --out " + dir.file("x.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("norm_topk_prob is false"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.gguf")));
}

// A model whose rows the SentencePiece tokenizer fixture fills: fixture `variant` in `dir` with
// vocab_size `n` and its embedding (and untied lm_head) padded to n rows with zeros.
void copy_fixture_with_vocab(const std::string& variant, const std::string& dir, nlohmann::json patch, int64_t n) {
  patch["vocab_size"] = n;
  test::copy_fixture(variant, dir, patch);
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : test::read_all(dir + "/model.safetensors")) {
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      std::vector<float> v = t.to_floats();
      const int64_t cols = t.shape()[1];
      v.resize(n * cols, 0.0f);
      t = Tensor::from_floats(v, {n, cols});
    }
    out.emplace_back(name, t);
  }
  ASSERT_TRUE(save_tensors(dir + "/model.safetensors", out).ok());
}

// `loom export` of a Gemma 3 and a Phi-3 model whose tokenizer is SentencePiece-style (the gemma and
// llama2 tokenizer fixtures: Gemma's and Llama 2 / Phi-3's tokenizer.json layouts, without
// tokenizer.model), then `loom convert` back: the folder's tokenizer encodes corpus.txt and the
// fixture's cases to the source tokenizer.json's ids and decodes them alike, the chat template comes
// back, and the model gives the .gguf's logits.
TEST(Convert, SentencePieceExportAndBack) {
  const std::string tok_dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/";
  struct Case {
    const char* variant;
    nlohmann::json patch;
    const char* tokenizer;
    int64_t vocab;
    nlohmann::json config;
    const char* arch;
  };
  const std::string tmpl = "{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}";
  const Case cases[] = {
      {"gemma3", test::gemma3_llama_cpp_patch(), "gemma", 1756,
       {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"}, {"chat_template", tmpl}},
       "gemma3"},
      {"phi3", nlohmann::json::object(), "llama2", 1571,
       {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"chat_template", tmpl}}, "phi3"},
  };
  std::string corpus;
  {
    std::ifstream in(tok_dir + "corpus.txt", std::ios::binary);
    corpus.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variant);
    test::TempDir dir("loom_convert_spm");
    const std::string src = dir.file("src"), gguf = dir.file("m.gguf"), back = dir.file("back");
    std::filesystem::create_directory(src);
    copy_fixture_with_vocab(c.variant, src, c.patch, c.vocab);
    std::filesystem::copy_file(tok_dir + c.tokenizer + "/tokenizer.json", src + "/tokenizer.json");
    std::ofstream(src + "/tokenizer_config.json") << c.config.dump();
    auto r = test::run_loom("export --model " + src + " --out " + gguf + " --type f16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto f = GgufFile::open(gguf);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(*f->get_string("general.architecture"), c.arch);
    EXPECT_EQ(*f->get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f->get_strings("tokenizer.ggml.tokens")->size(), static_cast<size_t>(c.vocab));
    r = test::run_loom("convert --gguf " + gguf + " --out " + back + " --dtype f32");
    ASSERT_EQ(r.exit_code, 0) << r.output;

    auto want = Tokenizer::load(src + "/tokenizer.json");
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = Tokenizer::load(back);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<std::string> texts = {corpus};
    for (const auto& k : read_json(tok_dir + c.tokenizer + "/cases.json")["cases"]) texts.push_back(k["text"]);
    for (const std::string& text : texts)
      for (bool add : {false, true}) {
        const auto ids = want->encode(text, add);
        ASSERT_EQ(got->encode(text, add), ids) << text;
        EXPECT_EQ(got->decode(ids), want->decode(ids)) << text;
      }
    EXPECT_EQ(read_json(back + "/tokenizer_config.json")["chat_template"], tmpl);
    EXPECT_EQ(logits(back, DType::f32), logits(gguf, DType::f32));
  }
}

// `loom merge` keeps tokenizer.model and chat_template.jinja, so that `loom export` of the merged
// folder writes the vocabulary (from tokenizer.model) and chat template that exporting the source
// with its adapter writes.
TEST(Convert, MergedFolderExportsTheSameTokenizer) {
  const std::string tok_dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/spm_model/";
  test::TempDir dir("loom_convert_spm");
  const std::string src = dir.file("src"), merged = dir.file("merged"), adapter = test::fixture_dir("mistral") + "/adapter";
  std::filesystem::create_directory(src);
  copy_fixture_with_vocab("mistral", src, nlohmann::json::object(), 704);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model"})
    std::filesystem::copy_file(tok_dir + f, src + "/" + f);
  auto r = test::run_loom("merge --model " + src + " --adapter " + adapter + " --out " + merged);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"tokenizer.model", "chat_template.jinja"}) EXPECT_TRUE(std::filesystem::exists(merged + "/" + f)) << f;
  ASSERT_EQ(test::run_loom("export --model " + src + " --adapter " + adapter + " --out " + dir.file("a.gguf")).exit_code, 0);
  ASSERT_EQ(test::run_loom("export --model " + merged + " --out " + dir.file("b.gguf")).exit_code, 0);
  auto a = GgufFile::open(dir.file("a.gguf")), b = GgufFile::open(dir.file("b.gguf"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a->get_strings("tokenizer.ggml.tokens"), *b->get_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(a->get_string("tokenizer.chat_template").value_or("(none)"), b->get_string("tokenizer.chat_template").value_or("(none)"));
  EXPECT_EQ(*a->get_floats("tokenizer.ggml.scores"), *b->get_floats("tokenizer.ggml.scores"));
  EXPECT_EQ(*a->get_ints("tokenizer.ggml.token_type"), *b->get_ints("tokenizer.ggml.token_type"));
  EXPECT_EQ(*a->get_floats("tokenizer.ggml.scores"),
            read_json(tok_dir + "reference.json")["llama_cpp"]["llama"]["scores"].get<std::vector<double>>());
}

TEST(Convert, Errors) {
  test::TempDir dir("loom_convert");
  auto r = test::run_loom("convert --gguf " + kDir + "nope.gguf --out " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("nope.gguf"), std::string::npos) << r.output;
  r = test::run_loom("convert --gguf " + kDir + "tiny_llama.gguf --out " + dir.file("x") + " --dtype f16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--dtype f16: expected bf16 or f32"), std::string::npos) << r.output;
  r = test::run_loom("convert --out " + dir.file("x"));
  EXPECT_NE(r.output.find("--gguf is required"), std::string::npos) << r.output;
  // Not a GGUF: the reader's message reaches the user.
  r = test::run_loom("convert --gguf " + kDir + "tiny_llama.expected.safetensors --out " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("not a GGUF file"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x")));
  // Metadata that contradicts the tensors (one block more than the file holds): the converted
  // folder is loaded back before it is moved into place, so the error names the missing tensor
  // and nothing is left behind (it used to exit 0 with a folder that does not load).
  std::ifstream in(kDir + "tiny_llama.gguf", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "llama.block_count";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  uint32_t type = 0, blocks = 0;
  std::memcpy(&type, bytes.data() + at + key.size(), 4);
  ASSERT_EQ(type, 4u) << "llama.block_count is a uint32";
  std::memcpy(&blocks, bytes.data() + at + key.size() + 4, 4);
  ++blocks;
  std::memcpy(bytes.data() + at + key.size() + 4, &blocks, 4);
  std::ofstream(dir.file("more_blocks.gguf"), std::ios::binary) << bytes;
  r = test::run_loom("convert --gguf " + dir.file("more_blocks.gguf") + " --out " + dir.file("y"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("the converted model does not load"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.layers." + std::to_string(blocks - 1)), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("y")));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  // A folder that already holds a model is refused before anything is read.
  ASSERT_EQ(test::run_loom("convert --gguf " + kDir + "tiny_llama.gguf --out " + dir.file("z")).exit_code, 0);
  r = test::run_loom("convert --gguf " + kDir + "tiny_llama.gguf --out " + dir.file("z"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("already holds a model"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom
