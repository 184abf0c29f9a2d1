// The table of `loom train`'s run options (see run_options.h): each option declared once, with
// its default, help, range and what a resumed run and the ranks must agree on.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/precision.h"
#include "engine/status_macros.h"
#include "train/run_options.h"
#include "train/device_plan.h"

namespace loom {
namespace {

constexpr int64_t kSteps = int64_t{1} << 40;  // a bound on step counts that no run reaches

absl::Status bad(const std::string& name, const std::string& expected, const std::string& text) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, " ", expected, ", got '", text, "'"));
}

// Each maker takes `field`, a function returning a reference into the config.
template <class F>
RunOption integer(std::string name, std::string def, std::string help, int64_t lo, int64_t hi, OnResume on_resume,
                  F field) {
  RunOption o{name, false, std::move(def), std::move(help), on_resume};
  o.set = [name, lo, hi, field](const std::string& t, TrainConfig& c) -> absl::Status {
    int64_t v = 0;
    if (!absl::SimpleAtoi(t, &v)) return bad(name, "expects an integer", t);
    if (v < lo || v > hi) return bad(name, absl::StrCat("must be between ", lo, " and ", hi), t);
    field(c) = static_cast<std::remove_reference_t<decltype(field(c))>>(v);
    return absl::OkStatus();
  };
  o.get = [field](const TrainConfig& c) { return absl::StrCat(field(const_cast<TrainConfig&>(c))); };
  return o;
}

// A finite number in [lo, hi], lo itself excluded when lo_open.
template <class F>
RunOption number(std::string name, std::string def, std::string help, double lo, bool lo_open, double hi,
                 OnResume on_resume, F field) {
  RunOption o{name, false, std::move(def), std::move(help), on_resume};
  o.set = [name, lo, lo_open, hi, field](const std::string& t, TrainConfig& c) -> absl::Status {
    double v = 0;
    // inf and nan parse, and would train to a NaN loss without a word.
    if (!absl::SimpleAtod(t, &v) || !std::isfinite(v)) return bad(name, "expects a finite number", t);
    if (v < lo || (lo_open && v == lo) || v > hi)
      return bad(name, absl::StrCat("must be ", lo_open ? "above " : "at least ", lo, " and at most ", hi), t);
    field(c) = static_cast<std::remove_reference_t<decltype(field(c))>>(v);
    return absl::OkStatus();
  };
  o.get = [field](const TrainConfig& c) {  // %.9g round-trips a float, %.17g a double
    const auto v = field(const_cast<TrainConfig&>(c));
    return sizeof(v) == 4 ? absl::StrFormat("%.9g", static_cast<double>(v)) : absl::StrFormat("%.17g", static_cast<double>(v));
  };
  return o;
}

// Free text; `check` (may be null) refuses bad values.
template <class F>
RunOption text(std::string name, std::string help, OnResume on_resume, F field,
               std::function<absl::Status(const std::string&)> check = nullptr, std::string def = "") {
  RunOption o{name, false, std::move(def), std::move(help), on_resume};
  o.set = [field, check](const std::string& t, TrainConfig& c) -> absl::Status {
    if (check) LOOM_RETURN_IF_ERROR(check(t));
    field(c) = t;
    return absl::OkStatus();
  };
  o.get = [field](const TrainConfig& c) { return std::string(field(const_cast<TrainConfig&>(c))); };
  return o;
}

template <class F>
RunOption on_off(std::string name, std::string help, OnResume on_resume, F field) {
  RunOption o{name, true, "", std::move(help), on_resume};
  o.set = [name, field](const std::string& t, TrainConfig& c) -> absl::Status {
    if (t != "true" && t != "false") return bad(name, "is a switch: true or false", t);
    field(c) = t == "true";
    return absl::OkStatus();
  };
  o.get = [field](const TrainConfig& c) { return field(const_cast<TrainConfig&>(c)) ? "true" : "false"; };
  return o;
}

// A path: stored absolute, so that a resumed run finds it from another working directory.
template <class F>
RunOption path(std::string name, std::string help, F field) {
  RunOption o = text(std::move(name), std::move(help), OnResume::kFree, field);
  o.is_path = true;
  o.ranks_agree = false;  // hosts may mount files differently: their contents are compared instead
  return o;
}

absl::Status one_of(const std::string& name, const std::string& t, std::initializer_list<const char*> allowed) {
  std::vector<std::string> shown;
  for (const char* a : allowed) {
    if (t == a) return absl::OkStatus();
    if (*a) shown.push_back(a);
  }
  const std::string last = shown.back();
  shown.pop_back();
  return bad(name, absl::StrCat("must be ", absl::StrJoin(shown, ", "), shown.empty() ? "" : " or ", last), t);
}

std::vector<RunOption> make_table() {
  using C = TrainConfig;
  const auto kFree = OnResume::kFree, kWarned = OnResume::kWarned, kFixed = OnResume::kFixed;
  std::vector<RunOption> t;
  t.push_back(path("model", "a Hugging Face model folder (config.json, safetensors, tokenizer.json) or a llama.cpp .gguf file",
                   [](C& c) -> std::string& { return c.model_dir; }));
  t.push_back(path("data",
                   "JSONL, one example per line: {\"text\"}, {\"prompt\", \"completion\"}, {\"messages\": [...]} (tool_calls, "
                   "tool messages and \"tools\" as transformers takes them), ShareGPT {\"conversations\": [{\"from\", "
                   "\"value\"}...]} or Alpaca {\"instruction\", \"input\", \"output\"}; conversations use the model's chat "
                   "template (loss on assistant turns), Alpaca without one the classic Alpaca prompt. See what is trained "
                   "with `loom tokenize --input FILE --show`",
                   [](C& c) -> std::string& { return c.data_path; }));
  t.push_back(path("out", "output folder: adapter or model, checkpoints, metrics.jsonl, loss.svg (with --resume: the "
                          "resumed run's folder)",
                   [](C& c) -> std::string& { return c.out_dir; }));
  t.push_back(path("eval-data",
                   "held-out JSONL (same shapes as --data): its mean loss over the target tokens, without dropout, every "
                   "--eval-every steps and after the last, as eval_loss in metrics.jsonl and the progress line",
                   [](C& c) -> std::string& { return c.eval_data_path; }));
  t.push_back(integer("eval-every", "0", "evaluate --eval-data every N steps (0 = only after the last step)", 0, kSteps,
                      kFree, [](C& c) -> int64_t& { return c.eval_every; }));
  t.push_back(on_off("random-init",
                     "draw the weights N(0, 0.02) from --seed on the device instead of reading them: --model needs only "
                     "config.json (benchmarks of a model's shape)",
                     kFixed, [](C& c) -> bool& { return c.random_init; }));
  t.push_back(on_off("full", "full fine-tuning (all weights, f32 master + AdamW state) instead of LoRA", kFixed,
                     [](C& c) -> bool& { return c.full; }));
  t.push_back(integer("lora-r", "16", "LoRA rank", 1, 65536, kFixed, [](C& c) -> int64_t& { return c.lora.r; }));
  t.push_back(number("lora-alpha", "16", "LoRA alpha (scale alpha/r)", 0, true, 1e6, kFixed,
                     [](C& c) -> float& { return c.lora.alpha; }));
  t.push_back(number("lora-dropout", "0", "LoRA dropout probability", 0, false, 0.999, kFixed,
                     [](C& c) -> float& { return c.lora.dropout; }));
  {
    RunOption o{"lora-targets", false, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,qkv_proj,gate_up_proj",
                "comma-separated module names, or all-linear (Phi-3 fuses q/k/v as qkv_proj, gate/up as gate_up_proj); "
                "mixture-of-experts projections as PEFT's target_parameters: experts.gate_up_proj, experts.down_proj, "
                "or experts for both (one adapter per expert)",
                kFixed};
    o.set = [](const std::string& t, C& c) -> absl::Status {
      std::vector<std::string> names = absl::StrSplit(t, ',');
      c.lora.target_modules.clear();
      c.lora.target_parameters.clear();
      for (const std::string& n : names) {
        if (n.empty()) return bad("lora-targets", "has an empty module name (a stray comma?)", t);
        if (n == "experts") {
          c.lora.target_parameters.push_back("mlp.experts.gate_up_proj");
          c.lora.target_parameters.push_back("mlp.experts.down_proj");
        } else if (n.starts_with("experts.") || n.find(".experts.") != std::string::npos) {
          c.lora.target_parameters.push_back(n.starts_with("experts.") ? "mlp." + n : n);
        } else {
          c.lora.target_modules.push_back(n);
        }
      }
      return absl::OkStatus();
    };
    o.get = [](const C& c) {
      std::vector<std::string> all = c.lora.target_modules;
      all.insert(all.end(), c.lora.target_parameters.begin(), c.lora.target_parameters.end());
      return absl::StrJoin(all, ",");
    };
    t.push_back(o);
  }
  t.push_back(on_off("rslora", "rank-stabilised LoRA: scale alpha/sqrt(r)", kFixed,
                     [](C& c) -> bool& { return c.lora.use_rslora; }));
  t.push_back(on_off("qlora",
                     "QLoRA: quantise the decoder Linear weights to NF4 (bitsandbytes' format, double quantisation) as "
                     "they load and train LoRA on them (a checkpoint saved in 4 bits by transformers + bitsandbytes is "
                     "used as stored, with or without this flag)",
                     kFixed, [](C& c) -> bool& { return c.qlora; }));
  t.push_back(integer("seq-len", "1024", "tokens per packed row", 2, int64_t{1} << 24, kFixed,
                      [](C& c) -> int64_t& { return c.seq_len; }));
  // Per rank: a resumed run may change it with the number of ranks (the global batch must stay).
  t.push_back(integer("batch-size", "1", "rows per device per micro-batch", 1, int64_t{1} << 20, kFree,
                      [](C& c) -> int64_t& { return c.batch_size; }));
  t.push_back(integer("grad-accum", "1", "micro-batches per optimizer step", 1, int64_t{1} << 20, kFixed,
                      [](C& c) -> int64_t& { return c.grad_accum; }));
  // Not a size: any finite float (a huge one is how a divergence is provoked on purpose).
  t.push_back(number("lr", "2e-4", "peak learning rate", 0, true, 3.4e38, kWarned, [](C& c) -> float& { return c.lr; }));
  t.push_back(number("weight-decay", "0", "AdamW decoupled weight decay", 0, false, 3.4e38, kWarned,
                     [](C& c) -> float& { return c.weight_decay; }));
  t.push_back(text("optim", "adamw (torch.optim.AdamW) or adamw8bit (bitsandbytes' 8-bit blockwise state)", kFixed,
                   [](C& c) -> std::string& { return c.optim; },
                   [](const std::string& v) { return one_of("optim", v, {"adamw", "adamw8bit"}); }, "adamw"));
  t.push_back(text("objective",
                   "sft, or a preference loss over {\"prompt\", \"chosen\", \"rejected\"} pairs (TRL's formats): dpo, ipo, "
                   "simpo, orpo (dpo/ipo: the model without its LoRA adapters is the reference)",
                   kFixed, [](C& c) -> std::string& { return c.objective; },
                   [](const std::string& v) { return one_of("objective", v, {"sft", "dpo", "ipo", "simpo", "orpo"}); }, "sft"));
  t.push_back(number("beta", "0.1", "preference objectives: beta (TRL's)", 0, true, 1e6, kFixed,
                     [](C& c) -> double& { return c.beta; }));
  t.push_back(number("simpo-gamma", "0.5", "simpo: the target reward margin gamma", 0, false, 1e6, kFixed,
                     [](C& c) -> double& { return c.simpo_gamma; }));
  t.push_back(number("label-smoothing", "0", "dpo and simpo: conservative label smoothing, below 0.5", 0, false, 0.499,
                     kFixed, [](C& c) -> double& { return c.label_smoothing; }));
  {
    RunOption o{"router-aux-loss-coef", false, "config",
                "mixture-of-experts models: the load-balancing loss (transformers' load_balancing_loss_func) joins the "
                "loss times this (0: off; config: the model's router_aux_loss_coef); metrics.jsonl reports it as aux_loss",
                kFixed};
    o.set = [](const std::string& t, C& c) -> absl::Status {
      if (t == "config") {
        c.router_aux_loss_coef = -1;
        return absl::OkStatus();
      }
      double v = 0;
      if (!absl::SimpleAtod(t, &v) || !std::isfinite(v) || v < 0 || v > 1e3)
        return bad("router-aux-loss-coef", "expects config or a number from 0 to 1000", t);
      c.router_aux_loss_coef = v;
      return absl::OkStatus();
    };
    o.get = [](const C& c) {
      return c.router_aux_loss_coef < 0 ? std::string("config") : absl::StrFormat("%.17g", c.router_aux_loss_coef);
    };
    t.push_back(o);
  }
  t.push_back(integer("max-prompt-len", "0", "preference data: keep the last N prompt tokens (0 = all)", 0, int64_t{1} << 24,
                      kFixed, [](C& c) -> int64_t& { return c.max_prompt_len; }));
  t.push_back(text("pair-layout",
                   "preference batches: pack (each pair's sequences packed into rows with per-sequence attention; "
                   "no padding but the rows' ends) or pad (one sequence a row, right-padded, as TRL)",
                   kFixed, [](C& c) -> std::string& { return c.pair_layout; },
                   [](const std::string& v) { return one_of("pair-layout", v, {"pack", "pad"}); }, "pack"));
  // Free on resume: the table is reused when its key matches, and rebuilt (LoRA) when it does not.
  t.push_back(on_off("precompute-ref",
                     "dpo and ipo: score every pair under the reference once before training (kept in the run folder as "
                     "ref_logps.safetensors, reused on resume) instead of a reference forward each step (TRL's "
                     "precompute_ref_log_probs)",
                     kFree, [](C& c) -> bool& { return c.precompute_ref; }));
  t.push_back(number("max-grad-norm", "1", "global gradient-norm clip (0 = off)", 0, false, 1e9, kWarned,
                     [](C& c) -> float& { return c.max_grad_norm; }));
  t.push_back(text("schedule", "constant, linear or cosine", kWarned, [](C& c) -> std::string& { return c.schedule; },
                   [](const std::string& v) { return one_of("schedule", v, {"constant", "linear", "cosine"}); }, "linear"));
  t.push_back(integer("warmup", "0", "warmup steps", 0, kSteps, kWarned, [](C& c) -> int64_t& { return c.warmup_steps; }));
  t.push_back(integer("epochs", "1", "passes over the data", 1, 1000000, kFree, [](C& c) -> int64_t& { return c.epochs; }));
  t.push_back(integer("max-steps", "0", "optimizer steps (overrides --epochs; 0 = by --epochs)", 0, kSteps, kFree,
                      [](C& c) -> int64_t& { return c.max_steps; }));
  t.push_back(integer("seed", "42", "seed for LoRA init, shuffling and dropout", 0, INT64_MAX, kFixed,
                      [](C& c) -> uint64_t& { return c.seed; }));
  t.push_back(integer("save-every", "0", "checkpoint every N steps (0 = only at the end)", 0, kSteps, kFree,
                      [](C& c) -> int64_t& { return c.save_every; }));
  t.push_back(integer("save-total-limit", "0", "keep only the newest N checkpoint folders (0 = keep all)", 0, kSteps,
                      kFree, [](C& c) -> int64_t& { return c.save_total_limit; }));
  {
    RunOption o{"device", false, "cpu", "cpu, cuda or cuda:N", kFree, /*ranks_agree=*/false};
    o.set = [](const std::string& t, C& c) -> absl::Status {
      LOOM_ASSIGN_OR_RETURN(c.device, parse_device(t));
      return absl::OkStatus();
    };
    o.get = [](const C& c) { return c.device.str(); };
    t.push_back(o);
  }
  {
    RunOption o{"dtype", false, "auto",
                "compute dtype: bf16 or f32; auto = f32 on the CPU (bf16 there is slower and its rounding can change "
                "answers), bf16 on CUDA",
                kFixed};
    o.set = [](const std::string& t, C& c) -> absl::Status {
      if (t == "auto") {
        c.dtype.reset();
        return absl::OkStatus();
      }
      auto d = parse_model_dtype(t);
      if (!d.ok() || (*d != DType::bf16 && *d != DType::f32)) return bad("dtype", "must be auto, bf16 or f32", t);
      c.dtype = *d;
      return absl::OkStatus();
    };
    // Stored as what ran: a run on the CPU resumed on CUDA keeps its f32.
    o.get = [](const C& c) { return std::string(name(c.resolved_dtype())); };
    t.push_back(o);
  }
  {
    RunOption o{"checkpointing", false, "auto",
                "auto (the fastest of the three whose memory fits, estimated once the model is loaded), none (keep "
                "every activation: fastest, most memory), recompute (keep each layer's input, recompute the layer in "
                "backward, less what nothing reads: a quarter to a third more compute, activation memory of one layer), "
                "offload (as recompute, with the layer inputs in pinned host memory, copied on a side stream, and "
                "the attention outputs too while they fit, so that backward does not run the attention again: the "
                "least GPU memory; on the CPU recompute with each layer's attention output kept for the rerun)",
                kFree};
    o.set = [](const std::string& t, C& c) -> absl::Status {
      if (t == "auto") {
        c.checkpointing.reset();
        return absl::OkStatus();
      }
      auto m = parse_checkpointing(t);
      if (!m.ok()) return bad("checkpointing", "must be auto, none, recompute or offload", t);
      c.checkpointing = *m;
      return absl::OkStatus();
    };
    o.get = [](const C& c) { return c.checkpointing ? std::string(checkpointing_name(*c.checkpointing)) : "auto"; };
    t.push_back(o);
  }
  t.push_back(path("chat-template", "a .jinja file, or chatml (default: the model's own chat_template)",
                   [](C& c) -> std::string& { return c.chat_template; }));
  t.push_back(on_off("skip-bad-lines", "skip and count malformed JSONL lines instead of stopping", kFree,
                     [](C& c) -> bool& { return c.skip_bad_lines; }));
  {
    RunOption o = text("resume",
                       "continue a run: its --out folder (its latest intact checkpoint) or one checkpoint folder. Alone it "
                       "continues with the run's stored settings; flags beside it change what may change (--max-steps, "
                       "--save-every, --eval-every, --device, ...)",
                       kFree, [](C& c) -> std::string& { return c.resume; });
    o.stored = false;
    t.push_back(o);
  }
  t.push_back(on_off("overwrite",
                     "a fresh run into an --out folder holding an earlier run's adapter, model, metrics or checkpoints "
                     "replaces them (without it that folder is refused; --resume continues it instead)",
                     kFree, [](C& c) -> bool& { return c.overwrite; }));
  t.back().stored = false;
  t.push_back(on_off("no-verify",
                     "--resume without checksums.json, or with files that do not match it (the values are still "
                     "checked: counters in range, optimizer state finite)",
                     kFree, [](C& c) -> bool& { return c.no_verify; }));
  t.back().stored = false;
  t.push_back(on_off("gemm-autotune",
                     "time cuBLASLt's first 8 algorithms on each GEMM shape's first call and keep the fastest (a few "
                     "percent faster; a run's bits then depend on the timings, so two runs may differ in the last bits)",
                     kWarned, [](C& c) -> bool& { return c.gemm_autotune; }));
  t.push_back(on_off("allow-nonfinite", "load a model whose weights hold NaN or infinity (refused otherwise)", kFree,
                     [](C& c) -> bool& { return c.allow_nonfinite; }));
  t.push_back(integer("log-every", "1", "progress line every N steps when not on a terminal", 1, kSteps, kFree,
                      [](C& c) -> int64_t& { return c.log_every; }));
  t.back().ranks_agree = false;
  // Of this invocation, not of the run: a resumed run does not inherit them.
  t.push_back(integer("stop-after", "0", "stop after N steps of this run as if interrupted (checkpoint, exit 0)", 0, kSteps,
                      kFree, [](C& c) -> int64_t& { return c.stop_after; }));
  t.back().stored = false;
  t.push_back(on_off("quiet", "no progress output", kFree, [](C& c) -> bool& { return c.quiet; }));
  t.back().ranks_agree = false;
  t.back().stored = false;
  t.push_back(text("dist", "data parallelism over the MPI ranks (mpirun -np N loom train ...): ddp or zero2", kFree,
                   [](C& c) -> std::string& { return c.dist; },
                   [](const std::string& v) { return one_of("dist", v, {"", "ddp", "zero2"}); }));
  t.push_back(number("dist-timeout", "300", "seconds a collective may take before the job is aborted (a rank died or hangs)",
                     0, true, 1e7, kFree, [](C& c) -> double& { return c.dist_timeout; }));
  t.push_back(on_off("offload-optimizer",
                     "CPU optimizer offload (DeepSpeed's offload_optimizer: cpu): f32 master weights and optimizer state "
                     "in pinned host memory, the update on the CPU; saves their GPU memory, costs a gradient copy down and "
                     "a weight copy up per step and the CPU update's time",
                     kFree, [](C& c) -> bool& { return c.offload_optimizer; }));
  {
    RunOption o = text("device-map",
                       "place the model over devices (accelerate's device_map): auto, balanced (even over the GPUs), "
                       "sequential (fill cuda:0, then cuda:1, ...) or a JSON file {\"model.layers.0\": 0, ...}; layers "
                       "past the GPUs' caps stay in host memory and are streamed to the GPU a layer ahead. The plan is "
                       "printed at start; checkpoints do not depend on it",
                       kFree, [](C& c) -> std::string& { return c.device_map; });
    o.ranks_agree = false;
    t.push_back(o);
  }
  t.push_back(text("max-memory",
                   "caps for --device-map: cuda:0=20GiB,cuda:1=20GiB,cpu=100GiB (units B, KB, MB, GB, KiB, MiB, GiB; "
                   "default: each device's free memory)",
                   kFree, [](C& c) -> std::string& { return c.max_memory; },
                   [](const std::string& v) -> absl::Status {
                     if (v.empty()) return absl::OkStatus();
                     auto caps = parse_max_memory(v);
                     return caps.ok() ? absl::OkStatus() : caps.status();
                   }));
  t.back().ranks_agree = false;
  return t;
}

}  // namespace

const std::vector<RunOption>& run_options() {
  static const std::vector<RunOption> table = make_table();
  return table;
}

}  // namespace loom
