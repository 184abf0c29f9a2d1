// The objective seam (train/objective.h): what SFT counts and how an unknown objective is refused; a
// preference objective on a mixture-of-experts model adds transformers' masked load-balancing loss.
// Its loss is the trainer's: the e2e tests (eval loss against an f64 per-document reference,
// ranks against one process, resume bit for bit) run through it.
#include "train/objective.h"
#include "train/pair_loader.h"

#include <gtest/gtest.h>

#include "models/causal_lm.h"
#include "tests/models/fixtures.h"

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

}  // namespace
}  // namespace loom
