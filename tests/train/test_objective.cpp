// The objective seam (train/objective.h): what SFT counts and how an unknown objective is refused; a
// preference objective on a mixture-of-experts model adds transformers' masked load-balancing loss.
// Its loss is the trainer's: the e2e tests (eval loss against an f64 per-document reference,
// ranks against one process, resume bit for bit) run through it.
#include "train/objective.h"
#include "train/pair_loader.h"

#include <gtest/gtest.h>

#include "models/causal_lm.h"
#include "tests/models/fixtures.h"
#include "tests/temp_dir.h"
#include "train/preference_forward.h"

namespace loom {
namespace {

TEST(Objective, SftCountsTheTargetTokens) {
  auto sft = make_objective("sft");
  ASSERT_TRUE(sft.ok()) << sft.status();
  EXPECT_EQ((*sft)->name(), "sft");
  // Two documents packed into a row of 8: labels -100 on the first token of each and on padding.
  std::vector<Example> docs = {{{5, 6, 7}, {0, 1, 1}}, {{8, 9, 10, 11}, {0, 0, 1, 1}}};
  PackedLoader loader(docs, 8, 1, 42, 0, 1, 0);
  const Batch b = loader.next();
  EXPECT_EQ((*sft)->units(b), b.target_tokens);
  EXPECT_EQ(b.target_tokens, 4);
  EXPECT_EQ(b.row_tokens, std::vector<int64_t>{7});  // then one padding token
}

TEST(Objective, AnUnknownOneNamesThoseThereAre) {
  auto bad = make_objective("sgd");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("unknown objective 'sgd' (there is: sft, dpo, ipo, simpo, orpo)"),
            std::string::npos)
      << bad.status();
}

// A preference objective's units are the batch's pairs (its loss is a mean over them); the pair
// loader keeps both sequences of a pair in one batch, chosen rows first.
TEST(Objective, PreferenceCountsPairs) {
  auto dpo = make_objective("dpo");
  ASSERT_TRUE(dpo.ok()) << dpo.status();
  EXPECT_EQ((*dpo)->name(), "dpo");
  std::vector<PreferenceExample> pairs = {{{1, 2}, {3, 4, 5}, {6}}, {{7}, {8}, {9, 10}}, {{11, 12, 13}, {14}, {15}}};
  PairLoader loader(pairs, 2, 42, 0);
  const Batch b = loader.next();
  EXPECT_EQ(b.pairs, 2);
  EXPECT_EQ((*dpo)->units(b), 2);
  ASSERT_EQ(b.input_ids.size(0), 4);
  // Row i and row i + 2 are one pair: the same prompt, their completions as labels, the rest -100.
  const std::vector<int32_t> ids = b.input_ids.to_ints(), labels = b.labels.to_ints();
  const int64_t S = b.input_ids.size(1);
  for (int64_t i = 0; i < 2; ++i) {
    int64_t prompt = 0;
    while (prompt < S && labels[i * S + prompt] == -100) ++prompt;
    for (int64_t k = 0; k < prompt; ++k) EXPECT_EQ(ids[i * S + k], ids[(i + 2) * S + k]);
  }
  int64_t labelled = 0;
  for (int32_t l : labels) labelled += l != -100;
  EXPECT_EQ(b.target_tokens, labelled);
  const Batch last = loader.next();  // the epoch's short last batch: one pair
  EXPECT_EQ(last.pairs, 1);
  EXPECT_EQ(loader.state().epoch, 1);
}

// A preference batch on a mixture-of-experts model: TRL's DPOTrainer adds router_aux_loss_coef times
// outputs.aux_loss of its chosen + rejected batch, whose attention_mask leaves the padding out. The
// MoE fixtures' two rows (transformers' aux_loss_masked: row 1 padded from position 9) as one pair,
// chosen = row 0 (12 tokens), rejected = row 1 (9 tokens, then padding): the objective reports that
// value and adds it times the coefficient; the reference forward adds nothing.
TEST(Objective, PreferenceOnMoeAddsTheLoadBalancingLossOverBothSidesTokens) {
  for (const std::string variant : {"qwen3_moe", "mixtral"}) {
    auto model = CausalLM::load(test::fixture_dir(variant), {DType::f32, Device::cpu()});
    ASSERT_TRUE(model.ok()) << model.status();
    auto in = test::read_all(test::fixture_dir(variant) + "/inputs.safetensors");
    auto ref = test::read_all(test::fixture_dir(variant) + "/reference.safetensors");
    Batch b;
    b.input_ids = in["input_ids"];
    b.labels = in["labels"];
    const int64_t rows = b.input_ids.size(0), seq = b.input_ids.size(1);
    ASSERT_EQ(rows, 2);
    std::vector<int32_t> pos;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < seq; ++j) pos.push_back(static_cast<int32_t>(j));
    b.positions = Tensor::from_ints(pos, {rows * seq});
    b.pairs = 1, b.pair_ids = {0};
    b.seq_start = {0, seq}, b.seq_len = {seq, 9};  // the mask: row 1's positions 9.. are padding
    auto d = upload({b}, Device::cpu(), (*model)->config().vocab_size);
    ASSERT_TRUE(d.ok()) << d.status();
    const double aux = ref["aux_loss_masked"].item(), coef = 0.25;
    auto loss_with = [&](double c, double* reported) {
      auto dpo = make_objective("dpo");
      EXPECT_TRUE(dpo.ok());
      (*dpo)->set_router_aux_loss(c);
      const double l = (*dpo)->loss(**model, (*d)[0]).value().item();
      const auto m = (*dpo)->device_metrics();
      EXPECT_EQ(m.size(), 1u);
      if (!m.empty()) {
        EXPECT_EQ(m[0].first, "aux_loss");
        *reported = m[0].second.item();
      }
      return l;
    };
    double reported0 = 0, reported = 0;
    const double base = loss_with(0, &reported0), with = loss_with(coef, &reported);
    EXPECT_NEAR(reported, aux, 2e-5) << variant;
    EXPECT_NEAR(reported0, aux, 2e-5) << variant << ": measured even when not added";
    EXPECT_NEAR(with - base, coef * aux, 2e-5) << variant;
  }
}

// SFT on a mixture-of-experts model: the padding that ends a packed row (Batch::row_tokens) is left
// out of the load-balancing loss, as transformers' attention_mask leaves it out (the MoE fixtures'
// aux_loss_masked: row 1 padded from position 9); with no padding, every token counts (aux_loss).
TEST(Objective, SftOnMoeLeavesThePaddingOutOfTheLoadBalancingLoss) {
  auto model = CausalLM::load(test::fixture_dir("qwen3_moe"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  auto in = test::read_all(test::fixture_dir("qwen3_moe") + "/inputs.safetensors");
  auto ref = test::read_all(test::fixture_dir("qwen3_moe") + "/reference.safetensors");
  const int64_t seq = in["input_ids"].size(1);
  for (bool padded : {true, false}) {
    Batch b;
    b.input_ids = in["input_ids"], b.labels = in["labels"];
    std::vector<int32_t> pos;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j = 0; j < seq; ++j) pos.push_back(static_cast<int32_t>(j));
    b.positions = Tensor::from_ints(pos, {2 * seq});
    b.row_tokens = {seq, padded ? 9 : seq};
    auto d = upload({b}, Device::cpu(), (*model)->config().vocab_size);
    ASSERT_TRUE(d.ok()) << d.status();
    auto sft = make_objective("sft");
    ASSERT_TRUE(sft.ok());
    (*sft)->set_router_aux_loss(0);
    (*sft)->loss(**model, (*d)[0]);
    const auto m = (*sft)->device_metrics();
    ASSERT_EQ(m.size(), 1u);
    EXPECT_NEAR(m[0].second.item(), ref[padded ? "aux_loss_masked" : "aux_loss"].item(), 2e-5) << "padded " << padded;
  }
}

// `loom forward --objective` (preference_forward) on a mixture-of-experts model: the pairs file's
// attention masks say which tokens the load-balancing loss averages over (transformers'
// aux_loss_masked of the MoE fixtures); without masks, a row counts up to its last labelled token.
TEST(PreferenceForward, MoeAddsTheLoadBalancingLossOfTheUnpaddedTokens) {
  auto model = CausalLM::load(test::fixture_dir("qwen3_moe"), {DType::f32, Device::cpu()});
  ASSERT_TRUE(model.ok()) << model.status();
  auto in = test::read_all(test::fixture_dir("qwen3_moe") + "/inputs.safetensors");
  auto ref = test::read_all(test::fixture_dir("qwen3_moe") + "/reference.safetensors");
  const Tensor ids = in["input_ids"], labels = in["labels"], mask = in["attention_mask_padded"];
  const int64_t seq = ids.size(1);
  auto row = [&](const Tensor& t, int64_t r) { return t.narrow(0, r, 1).contiguous(); };
  // The labels of row 1's padding (positions 9..) are -100, as a preference file has them.
  std::vector<int32_t> l1 = row(labels, 1).to_ints();
  for (int64_t j = 9; j < seq; ++j) l1[j] = -100;
  const Tensor rejected_labels = Tensor::from_ints(l1, {1, seq});
  test::TempDir dir;
  for (bool masks : {true, false}) {
    std::vector<std::pair<std::string, Tensor>> file = {{"chosen_input_ids", row(ids, 0)}, {"chosen_labels", row(labels, 0)},
                                                        {"rejected_input_ids", row(ids, 1)}, {"rejected_labels", rejected_labels}};
    if (masks) file.insert(file.end(), {{"chosen_attention_mask", row(mask, 0)}, {"rejected_attention_mask", row(mask, 1)}});
    const std::string path = dir.file(masks ? "masked.safetensors" : "plain.safetensors");
    ASSERT_TRUE(save_tensors(path, file, DType::i32).ok());
    auto f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    auto pairs = read_preference_pairs(*f, (*model)->config());
    ASSERT_TRUE(pairs.ok()) << pairs.status();
    ASSERT_EQ(pairs->rejected_unpadded[0].size(), 1u);
    EXPECT_EQ(pairs->rejected_unpadded[0][0].length, 9);  // the mask's ones, or up to the last label (position 8)
    PreferenceParams p;
    p.kind = PreferenceKind::kDpo;
    auto plain = preference_forward(**model, *pairs, p);
    auto with = preference_forward(**model, *pairs, p, 0.25);
    ASSERT_TRUE(plain.ok() && with.ok());
    ASSERT_TRUE(with->aux_loss.defined());
    EXPECT_NEAR(with->aux_loss.value().item(), ref["aux_loss_masked"].item(), 2e-5) << "masks " << masks;
    EXPECT_NEAR(with->result.loss.value().item() - plain->result.loss.value().item(), 0.25 * ref["aux_loss_masked"].item(),
                2e-5);
  }
  // A mask of something else than 0 and 1 is refused, naming it and where.
  std::vector<int32_t> bad = row(mask, 1).to_ints();
  bad[3] = 2;
  const std::string path = dir.file("bad.safetensors");
  ASSERT_TRUE(save_tensors(path,
                           {{"chosen_input_ids", row(ids, 0)}, {"chosen_labels", row(labels, 0)},
                            {"rejected_input_ids", row(ids, 1)}, {"rejected_labels", rejected_labels},
                            {"rejected_attention_mask", Tensor::from_ints(bad, {1, seq})}},
                           DType::i32)
                  .ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok());
  auto pairs = read_preference_pairs(*f, (*model)->config());
  ASSERT_FALSE(pairs.ok());
  EXPECT_NE(std::string(pairs.status().message()).find("rejected_attention_mask row 0 position 3 is 2"), std::string::npos)
      << pairs.status();
}

}  // namespace
}  // namespace loom
