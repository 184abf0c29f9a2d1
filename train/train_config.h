// TrainConfig: everything a `loom train` run is told, as plain values. Its flags, config keys,
// checks and resume/rank agreement are declared once in train/run_options.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/precision.h"
#include "models/causal_lm.h"
#include "models/lora.h"

namespace loom {

struct TrainConfig {
  std::string model_dir, data_path, out_dir;
  // Held-out JSONL (the same shapes as data_path): its loss, the mean over its target tokens with
  // no dropout and no gradients, every eval_every steps (0: only after the last) and after the last.
  std::string eval_data_path;
  int64_t eval_every = 0;
  bool full = false;  // full fine-tuning instead of LoRA
  // The model's weights drawn N(0, 0.02) (unit norms) from --seed on the device instead of read:
  // --model then needs only config.json (benchmarks of shapes whose checkpoint would not fit the disk).
  bool random_init = false;
  bool qlora = false;  // LoRA on NF4 base weights quantised as they load (a 4-bit checkpoint is 4-bit anyway)
  LoraConfig lora;
  int64_t seq_len = 1024, batch_size = 1, grad_accum = 1;
  float lr = 2e-4f, weight_decay = 0.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, max_grad_norm = 1.f;
  std::string optim = "adamw";  // adamw (torch.optim.AdamW) or adamw8bit (bitsandbytes' AdamW8bit)
  // What a step minimises (train/objective.h): sft, or a preference loss over pairs (dpo, ipo, simpo,
  // orpo) with its settings; --seq-len is then the longest pair sequence (--max-len, TRL's max_length).
  std::string objective = "sft";
  double beta = 0.1, simpo_gamma = 0.5, label_smoothing = 0.0;
  // Mixture-of-experts models: the load-balancing loss's coefficient; negative: the config's
  // router_aux_loss_coef (--router-aux-loss-coef config).
  double router_aux_loss_coef = -1;
  bool precompute_ref = false;
  std::string pair_layout = "pack";  // preference batches: "pack" or "pad" (train/pair_loader.h)  // dpo/ipo: the reference's scores computed once before training
  int64_t max_prompt_len = 0;  // preference data: prompts keep their last this many tokens (0 = all)
  std::string schedule = "linear";  // constant, linear, cosine (with warmup)
  int64_t warmup_steps = 0;
  int64_t epochs = 1, max_steps = 0;  // max_steps > 0 overrides epochs
  uint64_t seed = 42;
  int64_t save_every = 0;  // 0: only at the end
  int64_t save_total_limit = 0;  // > 0: keep only the newest this many checkpoint-<step> folders
  Device device = Device::cpu();
  // Storage and compute dtype of the model, bf16 or f32 (see Precision); unset: f32 on the CPU (where
  // bf16 is slower and its rounding changes answers), bf16 on CUDA. resolved_dtype() says which.
  std::optional<DType> dtype;
  // Unset: `auto`, the fastest mode whose memory fits on the device (train/checkpointing_plan.h).
  std::optional<Checkpointing> checkpointing;
  std::string chat_template;       // "" = detect from the model folder
  bool skip_bad_lines = false;
  std::string resume;              // an output folder (its latest checkpoint) or one checkpoint folder
  // A fresh run into a folder holding an earlier run's outputs replaces them (its checkpoints are
  // removed at the first save); without it such a folder is refused.
  bool overwrite = false;
  bool no_verify = false;        // --resume skips the checksums (the values are still checked)
  bool gemm_autotune = false;    // ops::set_gemm_autotune for the run (engine/ops.h)
  bool allow_nonfinite = false;  // a model whose weights hold NaN or infinity loads anyway
  int64_t log_every = 1;           // progress line cadence when stdout is not a terminal
  int64_t stop_after = 0;          // > 0: stop (save, return) after this many steps of this run, as if interrupted
  bool quiet = false;
  std::string dist;                // "" (one process), "ddp" or "zero2": data parallel over the MPI ranks
  double dist_timeout = 300;       // seconds a collective may take before the job is aborted
  bool offload_optimizer = false;  // f32 masters and optimizer state in pinned host memory, updated on the CPU
  // "" (the whole model on --device), or auto | balanced | sequential | an accelerate device_map JSON
  // file: parts of the model on several GPUs, layers past the caps streamed from host memory.
  std::string device_map;
  std::string max_memory;  // --max-memory cuda:0=20GiB,cpu=100GiB ("" = each device's free memory)

  DType resolved_dtype() const { return dtype.value_or(default_model_dtype(device)); }
};

}  // namespace loom
