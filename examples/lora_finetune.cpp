// Embedding Loom: load a Hugging Face model folder, add LoRA adapters, train a few AdamW steps on a
// tiny in-program batch and save a PEFT adapter. Usage: lora_finetune <model_dir> <adapter_out_dir>
#include <cstdio>
#include <vector>

#include <loom/loom.h>  // the whole public API: tensors, autograd, models, LoRA, AdamW

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

  // AdamW (torch semantics, no weight decay) over the LoRA matrices, which are f32 masters.
  loom::optim::Optimizer adamw(loom::optim::make_adamw({}));
  const int group = adamw.add_group({"lora", 1.f, 0.f});
  for (auto& [name, v] : loom::lora_parameters(**model)) adamw.add_param(name, *v, group);
  std::vector<float> losses;
  for (int step = 1; step <= 5; ++step) {
    loom::ag::Variable loss = loom::causal_lm_loss((*model)->forward(input_ids), input_ids);
    losses.push_back(loss.value().item());
    std::printf("step %d loss %.6f\n", step, losses.back());
    loom::ag::backward(loss);
    adamw.step(/*lr=*/1e-2f);
    adamw.zero_grad();
  }
  if (auto st = loom::save_adapter(**model, lora, argv[2]); !st.ok())
    return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
  std::printf("adapter saved to %s\n", argv[2]);
  return losses.back() < losses.front() ? 0 : 1;  // the tests rely on training making progress
}
