// `loom forward`: runs a Hugging Face model or .gguf file (optionally with a PEFT LoRA adapter) on
// token ids from a safetensors file and writes logits, the loss and, with --grads, the LoRA gradients;
// with --objective, a preference loss (train/preference_loss.h) over pairs of completions.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/tensor_io.h"
#include "models/lora.h"
#include "train/preference_forward.h"
#include "tools/cli_args.h"
#include "tools/device_map_flags.h"
#include "tools/commands.h"
#include "tools/outputs.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"model", false, "Hugging Face model folder (config.json + safetensors) or .gguf file", ""},
    {"adapter", false, "PEFT LoRA adapter folder to apply", ""},
    {"device", false, "cpu, cuda or cuda:N", "cpu"},
    {"dtype", false, kDtypeHelp, ""},
    {"input", false, "safetensors with input_ids (i32 [B,S]) and optional labels (i32 [B,S], -100 ignored)", ""},
    {"output", false, "safetensors to write: logits, loss, grad.<PEFT name>", ""},
    {"grads", true, "also write the gradient of the loss for every LoRA tensor (needs --adapter and labels)", ""},
    {"objective", false,
     "dpo, ipo, simpo or orpo: a preference loss over pairs instead (--input holds chosen_input_ids, chosen_labels, "
     "rejected_input_ids, rejected_labels, i32 [pairs, seq], and optionally chosen_attention_mask, "
     "rejected_attention_mask; --output gets loss, chosen_logps, rejected_logps, for dpo/ipo ref_chosen_logps, "
     "ref_rejected_logps (the reference is the model without the adapter), and aux_loss for a mixture-of-experts "
     "model: TRL's, over both sides' unpadded tokens)", ""},
    {"beta", false, "preference objectives: beta", "0.1"},
    {"simpo-gamma", false, "simpo: the target margin gamma", "0.5"},
    {"label-smoothing", false, "dpo and simpo: conservative label smoothing in [0, 0.5)", "0"},
    {"router-aux-loss-coef", false,
     "mixture-of-experts models: the loss (and its gradients) adds this times the load-balancing loss, which is "
     "written as aux_loss (transformers with output_router_logits; 0: the cross-entropy alone)", "0"},
    {"save-adapter", false, "also re-save the loaded adapter into this folder in PEFT format", ""},
    {"overwrite", true, kOverwriteHelp, ""},
    {"allow-nonfinite", true, kAllowNonfiniteHelp, ""},
    {"device-map", false, "place the model over devices: auto, balanced, sequential or a JSON file (see loom train)", ""},
    {"max-memory", false, "caps for --device-map: cuda:0=20GiB,cpu=100GiB", ""},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom forward: %s\n", std::string(s.message()).c_str());
  return 1;
}

absl::StatusOr<Tensor> read_ids(const SafetensorsFile& f, const std::string& name, bool required) {
  const TensorInfo* t = f.find(name);
  if (!t) {
    if (required) return absl::NotFoundError(absl::StrCat(f.path(), ": no tensor named ", name));
    return Tensor();
  }
  if (t->dtype != DType::i32 || t->shape.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", name, " must be int32 [batch, seq], got ",
                                                   std::string(loom::name(t->dtype)), shape_str(t->shape)));
  return read_tensor(f, *t);
}

absl::StatusOr<double> router_aux_loss_coef(const Args& args) {
  double coef = 0;
  if (!absl::SimpleAtod(args.str("router-aux-loss-coef"), &coef) || !(coef >= 0) || !std::isfinite(coef))
    return absl::InvalidArgumentError(
        absl::StrCat("--router-aux-loss-coef must be a number >= 0, got '", args.str("router-aux-loss-coef"), "'"));
  return coef;
}

int run_preference(const Args& args, const SafetensorsFile& in, Device device, DType dtype) {
  PreferenceParams params;
  auto kind = parse_preference_kind(args.str("objective"));
  if (!kind.ok()) return fail(absl::InvalidArgumentError(absl::StrCat("--objective: ", kind.status().message())));
  params.kind = *kind;
  for (auto [flag, into] : {std::pair{"beta", &params.beta}, std::pair{"simpo-gamma", &params.simpo_gamma},
                            std::pair{"label-smoothing", &params.label_smoothing}})
    if (!absl::SimpleAtod(args.str(flag), into) || !std::isfinite(*into))
      return fail(absl::InvalidArgumentError(absl::StrCat("--", flag, " must be a number, got '", args.str(flag), "'")));
  const absl::StatusOr<double> aux_coef = router_aux_loss_coef(args);
  if (!aux_coef.ok()) return fail(aux_coef.status());
  LoadOptions lo{dtype, device, false, args.flag("allow-nonfinite")};
  auto placement = placement_from_flags(args, args.str("model"), dtype, false);
  if (!placement.ok()) return fail(placement.status());
  lo.placement = *placement;
  auto model = CausalLM::load(args.str("model"), lo);
  if (!model.ok()) return fail(model.status());
  for (const std::string& note : (*model)->load_notes()) std::cerr << "note: " << note << "\n";
  if (args.has("adapter"))
    if (auto lc = load_adapter(**model, args.str("adapter")); !lc.ok()) return fail(lc.status());
  auto pairs = read_preference_pairs(in, (*model)->config());
  if (!pairs.ok()) return fail(pairs.status());
  const bool grads = args.flag("grads");
  std::optional<ag::NoGradGuard> no_grad;
  if (!grads) no_grad.emplace();
  auto r = preference_forward(**model, *pairs, params, *aux_coef);
  if (!r.ok()) return fail(r.status());
  const PreferenceMetrics& m = r->result.metrics;
  std::printf("%s: loss %.6f, rewards/chosen %.6f, rewards/rejected %.6f, rewards/accuracies %.3f, rewards/margins %.6f\n",
              preference_name(params.kind), m.loss, m.rewards_chosen, m.rewards_rejected, m.accuracy, m.margin);
  auto vec = [](const std::vector<float>& v) { return Tensor::from_floats(v, {static_cast<int64_t>(v.size())}); };
  std::vector<std::pair<std::string, Tensor>> outputs = {
      {"loss", r->result.loss.value().to(Device::cpu(), DType::f32).reshape({1})},
      {"chosen_logps", vec(r->chosen)},
      {"rejected_logps", vec(r->rejected)}};
  if (needs_reference(params.kind)) {
    outputs.emplace_back("ref_chosen_logps", vec(r->ref_chosen));
    outputs.emplace_back("ref_rejected_logps", vec(r->ref_rejected));
  }
  if (r->aux_loss.defined()) outputs.emplace_back("aux_loss", r->aux_loss.value().to(Device::cpu(), DType::f32).reshape({1}));
  if (grads) {
    ag::backward(r->result.loss);
    for (auto& [name, g] : peft_adapter_tensors(**model, true)) outputs.emplace_back("grad." + name, g);
  }
  if (absl::Status s = save_tensors(args.str("output"), outputs, DType::f32); !s.ok()) return fail(s);
  std::printf("loom forward: %s on %s in %s -> %s (%zu tensors)\n", (*model)->config().summary().c_str(),
              device.str().c_str(), std::string(loom::name(dtype)).c_str(), args.str("output").c_str(), outputs.size());
  return 0;
}

}  // namespace

int run_forward(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("forward", kFlags).c_str(), stdout);
    return 0;
  }
  for (const char* required : {"model", "input", "output"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  // The results file has no business inside the model or adapter folder (--output
  // <model>/model.safetensors would replace the weights) or over the input.
  if (absl::Status s = check_not_over_inputs("--output", args->str("output"),
                                             {{"--model", args->str("model")}, {"--adapter", args->str("adapter")},
                                              {"--input", args->str("input")}},
                                             /*inside=*/true);
      !s.ok())
    return fail(s);
  const bool overwrite = args->flag("overwrite");
  if (absl::Status s = check_out_file("--output", args->str("output"), overwrite); !s.ok()) return fail(s);
  if (args->has("save-adapter")) {
    if (absl::Status s = check_out_folder("--save-adapter", args->str("save-adapter"), overwrite); !s.ok()) return fail(s);
    if (absl::Status s = check_not_over_inputs("--save-adapter", args->str("save-adapter"),
                                               {{"--model", args->str("model")}, {"--adapter", args->str("adapter")}},
                                               /*inside=*/true);
        !s.ok())
      return fail(s);
  }
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  if (device->is_cuda() && device->index >= cuda_device_count())
    return fail(absl::InvalidArgumentError(absl::StrCat("--device ", device->str(), ": no such CUDA device")));
  auto dtype = dtype_flag(*args, *device);
  if (!dtype.ok()) return fail(dtype.status());
  const std::string dtype_name(loom::name(*dtype));
  const bool grads = args->flag("grads");
  if (grads && !args->has("adapter")) return fail(absl::InvalidArgumentError("--grads needs --adapter"));

  auto in = SafetensorsFile::open(args->str("input"));
  if (!in.ok()) return fail(in.status());
  if (args->has("objective")) return run_preference(*args, *in, *device, *dtype);
  auto ids = read_ids(*in, "input_ids", true);
  if (!ids.ok()) return fail(ids.status());
  auto labels = read_ids(*in, "labels", false);
  if (!labels.ok()) return fail(labels.status());
  if (labels->defined() && labels->shape() != ids->shape())
    return fail(absl::InvalidArgumentError(absl::StrCat(args->str("input"), ": labels ", shape_str(labels->shape()),
                                                        " and input_ids ", shape_str(ids->shape()), " differ in shape")));
  if (grads && !labels->defined()) return fail(absl::InvalidArgumentError("--grads needs labels in the input file"));

  LoadOptions lo{*dtype, *device, false, args->flag("allow-nonfinite")};
  auto placement = placement_from_flags(*args, args->str("model"), *dtype, false);
  if (!placement.ok()) return fail(placement.status());
  lo.placement = *placement;
  auto model = CausalLM::load(args->str("model"), lo);
  if (!model.ok()) return fail(model.status());
  for (const std::string& note : (*model)->load_notes()) std::cerr << "note: " << note << "\n";
  const ModelConfig& c = (*model)->config();
  const std::vector<int32_t> id_values = ids->to_ints();
  for (size_t i = 0; i < id_values.size(); ++i)
    if (id_values[i] < 0 || id_values[i] >= c.vocab_size)
      return fail(absl::OutOfRangeError(absl::StrCat(args->str("input"), ": input_ids[", i / ids->size(1), ", ",
                                                     i % ids->size(1), "] = ", id_values[i],
                                                     " is outside the vocabulary [0, ", c.vocab_size, ")")));
  if (ids->size(1) > c.max_position_embeddings)
    return fail(absl::OutOfRangeError(absl::StrCat("sequence length ", ids->size(1), " exceeds the model's ",
                                                   "max_position_embeddings ", c.max_position_embeddings)));
  if (labels->defined())
    for (int32_t l : labels->to_ints())
      if (l != -100 && (l < 0 || l >= c.vocab_size))
        return fail(absl::OutOfRangeError(absl::StrCat(args->str("input"), ": label ", l, " is outside [0, ",
                                                       c.vocab_size, ") and is not -100")));
  if (args->has("adapter")) {
    auto lc = load_adapter(**model, args->str("adapter"));
    if (!lc.ok()) return fail(lc.status());
    if (args->has("save-adapter")) {
      auto staged = StagedFolder::create(args->str("save-adapter"));
      if (!staged.ok()) return fail(staged.status());
      if (absl::Status s = save_adapter(**model, *lc, staged->dir()); !s.ok()) return fail(s);
      if (absl::Status s = staged->commit(); !s.ok()) return fail(s);
    }
  }

  std::optional<ag::NoGradGuard> no_grad;
  if (!grads) no_grad.emplace();
  // Mixture-of-experts models: the load-balancing loss of the same forward's routers.
  const absl::StatusOr<double> coef = router_aux_loss_coef(*args);
  if (!coef.ok()) return fail(coef.status());
  ag::Variable aux;
  ForwardOptions opt;
  if (c.moe.experts > 0 && labels->defined()) opt.aux_loss = &aux;
  ag::Variable logits = (*model)->forward(*ids, opt);
  std::vector<std::pair<std::string, Tensor>> outputs = {{"logits", logits.value()}};
  if (labels->defined()) {
    ag::Variable loss = causal_lm_loss(logits, *labels);
    if (aux.defined()) {
      outputs.emplace_back("aux_loss", aux.value().to(DType::f32).reshape({1}));
      loss = add_load_balancing(loss, aux, *coef);
    }
    outputs.emplace_back("loss", loss.value().to(DType::f32).reshape({1}));
    if (grads) {
      ag::backward(loss);
      for (auto& [name, g] : peft_adapter_tensors(**model, true)) outputs.emplace_back("grad." + name, g);
    }
  }
  if (absl::Status s = save_tensors(args->str("output"), outputs, DType::f32); !s.ok()) return fail(s);
  std::printf("loom forward: %s on %s in %s -> %s (%zu tensors)\n", c.summary().c_str(), device->str().c_str(),
              dtype_name.c_str(), args->str("output").c_str(), outputs.size());
  return 0;
}

}  // namespace loom::cli
