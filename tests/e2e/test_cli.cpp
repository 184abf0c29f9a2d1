// `loom forward`, `loom merge` and `loom demo` end to end: outputs against the transformers/PEFT
// references, and bad input answered with a message and a non-zero exit (never a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/e2e/cli.h"
#include "tests/models/fixtures.h"
#include "text/tokenizer.h"

namespace loom::test {
namespace {

const std::string kQwen2 = fixture_dir("qwen2");

// `loom init` of the demo config with one field changed, into tmp/name/model; returns that folder.
std::string demo_model_with(const std::string& name, const std::string& field, const nlohmann::json& value) {
  const std::string dir = ::testing::TempDir() + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/cfg");
  const std::string demo_cfg = std::string(LOOM_SOURCE_DIR) + "/examples/demo/model-config";
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(demo_cfg + "/config.json"));
  cfg[field] = value;
  std::ofstream(dir + "/cfg/config.json") << cfg.dump();
  std::filesystem::copy_file(demo_cfg + "/tokenizer.json", dir + "/cfg/tokenizer.json");
  RunResult r = run_loom("init --from " + dir + "/cfg --out " + dir + "/model");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir + "/model";
}

TEST(Cli, ForwardWritesLogitsLossAndLoraGradients) {
  const std::string out = ::testing::TempDir() + "loom_forward_out.safetensors";
  std::filesystem::remove(out);  // forward refuses an existing --output without --overwrite
  RunResult r = run_loom("forward --model " + kQwen2 + " --adapter " + kQwen2 + "/adapter --input " + kQwen2 +
                         "/inputs.safetensors --output " + out + " --grads");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = read_all(out);
  auto ref = read_all(kQwen2 + "/reference_lora.safetensors");
  ASSERT_TRUE(got.count("logits") && got.count("loss"));
  EXPECT_EQ(got["logits"].dtype(), DType::f32);
  EXPECT_EQ(got["loss"].shape(), (Shape{1}));
  EXPECT_LT(rel_err(got["logits"], ref["logits"]), 2e-5);  // f32 CPU vs torch f32 CPU
  EXPECT_NEAR(got["loss"].item(), ref["loss"].item(), 1e-5 * ref["loss"].item());
  int grads = 0;
  for (auto& [name, t] : got) {
    if (name.rfind("grad.", 0) != 0) continue;
    ++grads;
    ASSERT_TRUE(ref.count(name)) << name;
    EXPECT_LT(rel_err(t, ref[name]), 1e-4) << name;
  }
  EXPECT_EQ(grads, 28);  // 2 layers x 7 modules x (A, B)
}

TEST(Cli, ForwardWithoutLabelsWritesOnlyLogits) {
  const std::string in = ::testing::TempDir() + "loom_ids_only.safetensors";
  auto ids = read_all(kQwen2 + "/inputs.safetensors")["input_ids"];
  ASSERT_TRUE(write_safetensors(in, {{"input_ids", DType::i32, ids.shape(),
                                      std::span<const uint8_t>(static_cast<const uint8_t*>(ids.data_ptr()), ids.nbytes())}})
                  .ok());
  const std::string out = ::testing::TempDir() + "loom_forward_logits.safetensors";
  std::filesystem::remove(out);
  RunResult r = run_loom("forward --model " + kQwen2 + " --input " + in + " --output " + out + " --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = read_all(out);
  EXPECT_EQ(got.size(), 1u);
  EXPECT_LT(rel_err(got["logits"], read_all(kQwen2 + "/reference.safetensors")["logits"]), 4e-2);  // bf16 model
}

TEST(Cli, MergeWritesACheckpointLoomReloads) {
  const std::string out = ::testing::TempDir() + "loom_cli_merged";
  std::filesystem::remove_all(out);  // merge refuses a folder that already holds a model
  RunResult r = run_loom("merge --model " + kQwen2 + " --adapter " + kQwen2 + "/adapter --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out + "/config.json"));
  const std::string logits = ::testing::TempDir() + "loom_merged_logits.safetensors";
  std::filesystem::remove(logits);
  r = run_loom("forward --model " + out + " --input " + kQwen2 + "/inputs.safetensors --output " + logits);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(rel_err(read_all(logits)["logits"], read_all(kQwen2 + "/reference_lora.safetensors")["merged_logits"]), 3e-2);
}

struct BadCase {
  std::string args;
  std::string expect;  // a phrase the message must contain
};

TEST(Cli, BadInputGivesAClearErrorAndNonZeroExit) {
  const std::string tmp = ::testing::TempDir();
  // A model whose vocab_size is smaller than its tokenizer (generate used to crash in the
  // embedding on the first id past it).
  const std::string small_vocab = demo_model_with("loom_small_vocab", "vocab_size", 1000);
  const std::string out = tmp + "loom_bad_out.safetensors";
  std::ofstream(tmp + "loom_not_safetensors.safetensors") << "this is not a safetensors file";
  auto ids = read_all(kQwen2 + "/inputs.safetensors")["input_ids"].to_ints();
  ids[5] = 5000;  // beyond the 128-token vocabulary
  Tensor bad = Tensor::from_ints(ids, {2, 12});
  ASSERT_TRUE(write_safetensors(tmp + "loom_bad_ids.safetensors",
                                {{"input_ids", DType::i32, bad.shape(),
                                  std::span<const uint8_t>(static_cast<const uint8_t*>(bad.data_ptr()), bad.nbytes())}})
                  .ok());
  const std::vector<BadCase> cases = {
      {"forward --model /nonexistent --input " + kQwen2 + "/inputs.safetensors --output " + out, "/nonexistent"},
      {"forward --model " + kQwen2 + " --input " + tmp + "loom_not_safetensors.safetensors --output " + out,
       "loom_not_safetensors.safetensors"},
      {"forward --model " + kQwen2 + " --input " + tmp + "loom_bad_ids.safetensors --output " + out, "5000"},
      {"forward --model " + kQwen2 + " --input " + kQwen2 + "/inputs.safetensors --output " + out + " --dtype f16", "--dtype"},
      {"forward --model " + kQwen2 + " --input " + kQwen2 + "/inputs.safetensors --output " + out + " --grads", "--adapter"},
      {"forward --model " + kQwen2 + " --adapter /nonexistent/adapter --input " + kQwen2 + "/inputs.safetensors --output " + out,
       "adapter"},
      {"forward --model " + kQwen2, "--input"},
      {"forward --bogus-flag 1", "--bogus-flag"},
      {"forward --model " + kQwen2 + " --input " + kQwen2 + "/inputs.safetensors --output /nonexistent/dir/out.safetensors",
       "/nonexistent/dir"},
      {"merge --model " + kQwen2 + " --adapter " + fixture_dir("qwen3") + "/adapter --out " + tmp + "loom_bad_merge", "lora"},
      {"no-such-command", "unknown command"},
      {"generate --model " + small_vocab + " --prompt hello --max-new-tokens 2", "vocab_size is 1000"},
      {"demo --steps zero", "--steps"},
      {"bench-cpu --model " + kQwen2 + " --seq-len 100000 --steps 1", "max_position_embeddings"},
  };
  for (const auto& c : cases) {
    RunResult r = run_loom(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.output;
    EXPECT_LT(r.exit_code, 128) << "crashed: " << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\nmessage: " << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(out)) << "a failed run left an output file";
}

// generate stops at the model's context length and says so (it used to stop without a word).
TEST(Cli, GenerateSaysWhenItStopsAtTheContextLength) {
  const std::string model = demo_model_with("loom_short_context", "max_position_embeddings", 12);
  RunResult r = run_loom("generate --model " + model + " --prompt hello --max-new-tokens 50 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stopped at the model's max_position_embeddings (12 tokens with the prompt)"), std::string::npos)
      << r.output;
}

TEST(Cli, DemoTrainsAndTheLossFalls) {
  RunResult r = run_loom("demo --steps 12");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto first = r.output.find("step   1  loss "), last = r.output.find("step  12  loss ");
  ASSERT_NE(first, std::string::npos) << r.output;
  ASSERT_NE(last, std::string::npos) << r.output;
  EXPECT_LT(std::stof(r.output.substr(last + 15)), std::stof(r.output.substr(first + 15)) * 0.8f) << r.output;
}

}  // namespace
}  // namespace loom::test

namespace loom::test {
namespace {

TEST(Cli, TokenizePrintsTheTokenizersIds) {
  const std::string tok = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/llama3/tokenizer.json";
  RunResult r = run_loom("tokenize --tokenizer " + tok + " --text 'The loom weaves 42 threads.'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto t = Tokenizer::load(tok);
  ASSERT_TRUE(t.ok());
  const auto ids = t->encode("The loom weaves 42 threads.");
  std::string want = "[";
  for (size_t i = 0; i < ids.size(); ++i) want += (i ? "," : "") + std::to_string(ids[i]);
  want += "]";
  std::string got = r.output;
  got.erase(std::remove_if(got.begin(), got.end(), ::isspace), got.end());
  EXPECT_EQ(got, want);
  EXPECT_NE(run_loom("tokenize --tokenizer /nonexistent.json --text x").exit_code, 0);
}

// --input renders each record as training does: a {"messages"} record with the model's own chat
// template (here Qwen2.5's, whose text transformers rendered into tests/fixtures/chat/cases.json),
// {"text"} with BOS/EOS as the trainer adds them, one line of ids per record.
TEST(Cli, TokenizeInputRendersRecordsAsTrainingDoes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "loom_tokenize_model";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string src = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures";
  fs::copy_file(src + "/tokenizers/qwen2/tokenizer.json", dir / "tokenizer.json");
  std::ifstream tf(src + "/chat/templates/qwen2_5.jinja");
  std::stringstream tmpl;
  tmpl << tf.rdbuf();
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json{{"chat_template", tmpl.str()}, {"eos_token", "<|im_end|>"}}.dump();
  std::ifstream cf(src + "/chat/cases.json");
  const nlohmann::json cases = nlohmann::json::parse(cf);
  nlohmann::json want_case;
  for (const auto& c : cases)
    if (c["template"] == "qwen2_5" && c["name"] == "multi_turn_system" && !c["add_generation_prompt"]) want_case = c;
  ASSERT_FALSE(want_case.is_null());
  const std::string data = (dir / "data.jsonl").string();
  std::ofstream(data) << nlohmann::json{{"messages", want_case["messages"]}}.dump() << "\n\n"
                      << R"({"text": "The loom weaves."})" << "\n";
  RunResult r = run_loom("tokenize --tokenizer " + dir.string() + " --input " + data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto t = Tokenizer::load(dir.string());
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> text_ids = t->encode("The loom weaves.", /*add_special_tokens=*/true);
  text_ids.push_back(*t->eos_id());
  std::vector<std::vector<int32_t>> want = {t->encode(want_case["text"].get<std::string>(), false), text_ids};
  std::vector<std::vector<int32_t>> got;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '[') got.push_back(nlohmann::json::parse(line).get<std::vector<int32_t>>());
  EXPECT_EQ(got, want) << r.output;
  // A record the template rejects is an error naming the line.
  std::ofstream(data) << R"({"text": "fine"})" << "\n" << R"({"messages": [{"role": "robot", "content": "x"}]})" << "\n";
  r = run_loom("tokenize --tokenizer " + dir.string() + " --input " + data);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(data + ":2: "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace loom::test
