// Loom's public API in one header, for programs that embed it (as <torch/torch.h> or "ggml.h" are):
//   #include <loom/loom.h>
// with find_package(Loom) and target_link_libraries(app PRIVATE loom::loom). It brings tensors
// and ops (engine), the tape autograd, AdamW, Hugging Face model families with LoRA/QLoRA and
// generation, the tokenizer and chat templates, and (when built) the trainer.
#pragma once

#include "autograd/functions.h"
#include "autograd/tape.h"
#include "autograd/variable.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/ops.h"
#include "engine/precision.h"
#include "engine/safetensors.h"
#include "engine/status_macros.h"
#include "engine/tensor.h"
#include "engine/tensor_io.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/generate.h"
#include "models/lora.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#if __has_include("train/trainer.h")
#include "train/data.h"
#include "train/trainer.h"
#endif
