// `loom train`: fine-tunes a Hugging Face model on a JSONL file (LoRA or full), with progress,
// metrics.jsonl, loss.svg, checkpoints and resume. SIGINT/SIGTERM finish the step, save, exit 0.
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/precision.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "train/checkpointing_plan.h"
#include "train/trainer.h"

namespace loom::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"config", false, "file of `key = value` lines with any of these flags (command line wins)", ""},
    {"model", false, "Hugging Face model folder (config.json, safetensors, tokenizer.json)", ""},
    {"data", false, "JSONL: {\"text\"} | {\"messages\": [...]} | {\"prompt\", \"completion\"} per line", ""},
    {"out", false, "output folder: adapter or model, checkpoints, metrics.jsonl, loss.svg", ""},
    {"eval-data", false,
     "held-out JSONL (same shapes as --data): its mean loss over the target tokens, without dropout, "
     "every --eval-every steps and after the last, as eval_loss in metrics.jsonl and the progress line", ""},
    {"eval-every", false, "evaluate --eval-data every N steps (0 = only after the last step)", "0"},
    {"full", true, "full fine-tuning (all weights, f32 master + AdamW state) instead of LoRA", ""},
    {"lora-r", false, "LoRA rank", "16"},
    {"lora-alpha", false, "LoRA alpha (scale alpha/r)", "16"},
    {"lora-dropout", false, "LoRA dropout", "0"},
    {"lora-targets", false, "comma-separated module names, or all-linear",
     "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"},
    {"rslora", true, "rank-stabilised LoRA: scale alpha/sqrt(r)", ""},
    {"qlora", true,
     "QLoRA: quantise the decoder Linear weights to NF4 (bitsandbytes' format, double quantisation) as "
     "they load and train LoRA on them (a checkpoint saved in 4 bits by transformers + bitsandbytes is "
     "used as stored, with or without this flag)", ""},
    {"seq-len", false, "tokens per packed row", "1024"},
    {"batch-size", false, "rows per device per micro-batch", "1"},
    {"grad-accum", false, "micro-batches per optimizer step", "1"},
    {"lr", false, "peak learning rate", "2e-4"},
    {"weight-decay", false, "AdamW decoupled weight decay", "0"},
    {"optim", false, "adamw (torch.optim.AdamW) or adamw8bit (bitsandbytes' 8-bit blockwise state)", "adamw"},
    {"max-grad-norm", false, "global gradient-norm clip (0 = off)", "1"},
    {"schedule", false, "constant, linear or cosine", "linear"},
    {"warmup", false, "warmup steps", "0"},
    {"epochs", false, "passes over the data", "1"},
    {"max-steps", false, "optimizer steps (overrides --epochs)", "0"},
    {"seed", false, "seed for LoRA init, shuffling and dropout", "42"},
    {"save-every", false, "checkpoint every N steps (0 = only at the end)", "0"},
    {"save-total-limit", false, "keep only the newest N checkpoint folders (0 = keep all)", "0"},
    {"device", false, "cpu, cuda or cuda:N", "cpu"},
    {"dtype", false, "compute dtype: bf16 or f32", "bf16"},
    {"checkpointing", false,
     "auto (the fastest of the three whose memory fits on the GPU, estimated once the model is "
     "loaded; none on the CPU), none (keep every activation: fastest, most memory), recompute (keep "
     "each layer's input, recompute the layer in backward: about a third more compute, activation "
     "memory of one layer), offload (as recompute, with the layer inputs in pinned host memory, "
     "copied on a side stream: the least GPU memory, host memory instead)", "auto"},
    {"chat-template", false, "a .jinja file, or chatml (default: the model's own chat_template)", ""},
    {"skip-bad-lines", true, "skip and count malformed JSONL lines instead of stopping", ""},
    {"resume", false, "an earlier --out folder (its latest checkpoint) or one checkpoint folder", ""},
    {"log-every", false, "progress line every N steps when not on a terminal", "1"},
    {"stop-after", false, "stop after N steps of this run as if interrupted (checkpoint, exit 0)", "0"},
    {"quiet", true, "no progress output", ""},
    {"dist", false, "data parallelism over the MPI ranks (mpirun -np N loom train ...): ddp or zero2", ""},
    {"dist-timeout", false, "seconds a collective may take before the job is aborted (a rank died or hangs)", "300"},
    {"offload-optimizer", true,
     "CPU optimizer offload (DeepSpeed's offload_optimizer: cpu): f32 master weights and optimizer "
     "state in pinned host memory, the update on the CPU; saves their GPU memory, costs a gradient "
     "copy down and a weight copy up per step and the CPU update's time", ""},
    {"help", true, "show this help", ""},
};

int fail(const absl::Status& s) {
  std::fprintf(stderr, "loom train: %s\n", std::string(s.message()).c_str());
  return 1;
}

void on_signal(int) { Trainer::request_stop(); }

}  // namespace

int run_train(const std::vector<std::string>& argv_in) {
  std::vector<std::string> argv = argv_in;
  std::map<std::string, bool> known;  // flag name -> takes no value
  for (const FlagSpec& f : kFlags)
    if (std::string(f.name) != "config" && std::string(f.name) != "help") known[f.name] = f.is_bool;
  for (size_t i = 0; i + 1 < argv_in.size(); ++i)
    if (argv_in[i] == "--config")
      if (absl::Status s = apply_config_file(argv_in[i + 1], &argv, known); !s.ok()) return fail(s);
  auto args = Args::parse(argv, kFlags);
  if (!args.ok()) return fail(args.status());
  if (args->flag("help")) {
    std::fputs(usage("train", kFlags).c_str(), stdout);
    return 0;
  }
  TrainConfig c;
  for (const char* required : {"model", "data", "out"})
    if (!args->has(required)) return fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
  c.model_dir = args->str("model");
  c.data_path = args->str("data");
  c.out_dir = args->str("out");
  c.eval_data_path = args->str("eval-data");
  c.full = args->flag("full");
  c.qlora = args->flag("qlora");
  if (c.full && (args->has("lora-r") || args->has("lora-targets")))
    return fail(absl::InvalidArgumentError("--full trains every weight; --lora-* flags do not apply"));
  struct Int {
    const char* flag;
    int64_t* dst;
  };
  for (Int f : {Int{"lora-r", &c.lora.r}, {"seq-len", &c.seq_len}, {"batch-size", &c.batch_size}, {"grad-accum", &c.grad_accum},
                {"warmup", &c.warmup_steps}, {"epochs", &c.epochs}, {"max-steps", &c.max_steps}, {"save-every", &c.save_every},
                {"save-total-limit", &c.save_total_limit},
                {"log-every", &c.log_every}, {"stop-after", &c.stop_after}, {"eval-every", &c.eval_every}}) {
    auto v = args->integer(f.flag);
    if (!v.ok()) return fail(v.status());
    *f.dst = *v;
  }
  struct Num {
    const char* flag;
    float* dst;
  };
  for (Num f : {Num{"lora-alpha", &c.lora.alpha}, {"lora-dropout", &c.lora.dropout}, {"lr", &c.lr},
                {"weight-decay", &c.weight_decay}, {"max-grad-norm", &c.max_grad_norm}}) {
    auto v = args->number(f.flag);
    if (!v.ok()) return fail(v.status());
    *f.dst = static_cast<float>(*v);
  }
  auto seed = args->integer("seed");
  if (!seed.ok()) return fail(seed.status());
  c.seed = static_cast<uint64_t>(*seed);
  c.lora.use_rslora = args->flag("rslora");
  c.lora.target_modules = absl::StrSplit(args->str("lora-targets"), ',');
  for (const std::string& t : c.lora.target_modules)
    if (t.empty())
      return fail(absl::InvalidArgumentError(absl::StrCat("--lora-targets '", args->str("lora-targets"),
                                                          "': an empty module name (a stray comma?)")));
  c.schedule = args->str("schedule");
  c.optim = args->str("optim");
  auto device = parse_device(args->str("device"));
  if (!device.ok()) return fail(device.status());
  c.device = *device;
  auto dtype = parse_model_dtype(args->str("dtype"));
  if (!dtype.ok()) return fail(dtype.status());
  c.dtype = *dtype;
  if (args->str("checkpointing") != "auto") {
    auto checkpointing = parse_checkpointing(args->str("checkpointing"));
    if (!checkpointing.ok())
      return fail(absl::InvalidArgumentError(absl::StrCat("--checkpointing must be auto, none, recompute or offload, got '",
                                                          args->str("checkpointing"), "'")));
    c.checkpointing = *checkpointing;
  }
  c.chat_template = args->str("chat-template");
  c.skip_bad_lines = args->flag("skip-bad-lines");
  c.resume = args->str("resume");
  c.quiet = args->flag("quiet");
  c.dist = args->str("dist");
  auto timeout = args->number("dist-timeout");
  if (!timeout.ok()) return fail(timeout.status());
  c.dist_timeout = *timeout;
  c.offload_optimizer = args->flag("offload-optimizer");

  // Running out of device memory: the engine says what and how much; this adds what to try with
  // this run's flags (tools/loom.cpp prints it without "internal error").
  std::unique_ptr<Trainer> trainer;
  try {
    auto created = Trainer::create(c);
    if (!created.ok()) return fail(created.status());
    trainer = std::move(*created);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    if (absl::Status s = trainer->run(); !s.ok()) return fail(s);
  } catch (const OutOfMemoryError& e) {
    std::optional<Checkpointing> mode;
    if (trainer) mode = trainer->checkpointing();
    throw OutOfMemoryError(absl::StrCat(e.what(), " ", out_of_memory_advice(c, mode, trainer ? trainer->step() + 1 : 0)));
  }
  if (!c.quiet) std::printf("loom train: %lld steps; output in %s\n", static_cast<long long>(trainer->step()), c.out_dir.c_str());
  return 0;
}

}  // namespace loom::cli
