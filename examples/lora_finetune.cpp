// Embedding Loom: load a Hugging Face model folder, add LoRA adapters, train a few AdamW steps on a
// tiny in-program batch and save a PEFT adapter. Usage: lora_finetune <model_dir> <adapter_out_dir>
#include <cstdio>
#include <vector>

#include "autograd/tape.h"
#include "engine/ops.h"
#include "kernels/adamw.h"
#include "models/lora.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <model_dir> <adapter_out_dir>\n", argv[0]);
    return 2;
  }
  loom::LoadOptions load;  // bf16 on a GPU, f32 on the CPU
  load.device = loom::cuda_available() ? loom::Device::cuda() : loom::Device::cpu();
  load.dtype = load.device.is_cuda() ? loom::DType::bf16 : loom::DType::f32;
  auto model = loom::CausalLM::load(argv[1], load);
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;

  loom::LoraConfig lora;
  lora.r = 8;
  lora.alpha = 16.f;
  if (auto st = loom::add_lora(**model, lora, /*seed=*/1234); !st.ok())
    return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;

  // One batch of 2 rows x 8 tokens: labels equal the inputs (the loss shifts them).
  const int vocab = static_cast<int>((*model)->config().vocab_size);
  std::vector<int32_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back((7 * i + 3) % vocab);
  loom::Tensor input_ids = loom::Tensor::from_ints(ids, {2, 8});

  auto params = loom::lora_parameters(**model);
  std::vector<loom::Tensor> exp_avg, exp_avg_sq;
  for (auto& [name, v] : params) {
    exp_avg.push_back(loom::Tensor::zeros(v->shape(), loom::DType::f32, v->device()));
    exp_avg_sq.push_back(loom::Tensor::zeros(v->shape(), loom::DType::f32, v->device()));
  }
  loom::AdamWParams adamw;
  adamw.lr = 1e-2f;
  std::vector<float> losses;
  for (int step = 1; step <= 5; ++step) {
    loom::ag::Variable loss = loom::causal_lm_loss((*model)->forward(input_ids), input_ids);
    losses.push_back(loss.value().item());
    std::printf("step %d loss %.6f\n", step, losses.back());
    loom::ag::backward(loss);
    adamw.step = step;
    for (size_t i = 0; i < params.size(); ++i) {
      loom::Tensor value = params[i].second->value();
      loom::ops::adamw_step(value, params[i].second->grad(), exp_avg[i], exp_avg_sq[i], adamw);
      params[i].second->zero_grad();
    }
  }
  if (auto st = loom::save_adapter(**model, lora, argv[2]); !st.ok())
    return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
  std::printf("adapter saved to %s\n", argv[2]);
  return losses.back() < losses.front() ? 0 : 1;  // the tests rely on training making progress
}
