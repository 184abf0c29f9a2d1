// See device_plan.h.
#include "train/device_plan.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/json_file.h"
#include "kernels/error.h"
#include "models/family.h"

namespace loom {
namespace {

std::string gib(int64_t b) { return absl::StrFormat("%.2f GiB", static_cast<double>(b) / (1LL << 30)); }

// NF4 with double quantisation: 4 bits a weight, an 8-bit absmax per 64 weights and an f32 absmax
// per 256 of those.
int64_t nf4_bytes(int64_t n) { return n / 2 + (n + 63) / 64 + 4 * ((n + 64 * 256 - 1) / (64 * 256)); }

bool targeted(const PlanOptions& o, const std::string& module) {
  return std::find(o.lora_targets.begin(), o.lora_targets.end(), module) != o.lora_targets.end();
}

}  // namespace

absl::StatusOr<int64_t> parse_bytes(const std::string& text_in) {
  const std::string text(absl::StripAsciiWhitespace(text_in));
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  double v = 0;
  if (i == 0 || !absl::SimpleAtod(text.substr(0, i), &v))
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (e.g. 20GiB, 500MB)"));
  const std::string unit = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text.substr(i)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},       {"B", 1},          {"KB", 1e3},       {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12},  {"KIB", 1024.0},   {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end())
    return absl::InvalidArgumentError(absl::StrCat("'", text, "': unknown unit '", text.substr(i),
                                                   "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"));
  const double bytes = v * it->second;
  if (!(bytes >= 0 && bytes < 9.2e18)) return absl::InvalidArgumentError(absl::StrCat("'", text, "' is out of range"));
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<MemoryCaps> parse_max_memory(const std::string& text) {
  MemoryCaps caps;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2)
      return absl::InvalidArgumentError(absl::StrCat("--max-memory: '", part, "' is not DEVICE=SIZE (e.g. cuda:0=20GiB)"));
    const std::string dev(absl::StripAsciiWhitespace(kv[0]));
    auto bytes = parse_bytes(kv[1]);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--max-memory ", dev, ": ", bytes.status().message()));
    int index = 0;
    if (dev == "cpu") {
      caps.cpu = *bytes;
    } else if ((absl::StartsWith(dev, "cuda:") && absl::SimpleAtoi(dev.substr(5), &index) && index >= 0) ||
               (absl::SimpleAtoi(dev, &index) && index >= 0)) {
      if (caps.gpu.count(index)) return absl::InvalidArgumentError(absl::StrCat("--max-memory: ", dev, " is given twice"));
      caps.gpu[index] = *bytes;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--max-memory: unknown device '", dev, "' (cpu, cuda:N or N)"));
    }
  }
  return caps;
}

std::vector<PlanUnit> plan_units(const ModelConfig& c, const PlanOptions& o) {
  const int64_t h = c.hidden_size, act = bytes_for(o.activation_dtype, 1);
  auto dense = [&](int64_t n) { return bytes_for(o.weight_dtype, n); };
  std::vector<PlanUnit> units;
  PlanUnit embed{"model.embed_tokens", dense(c.vocab_size * h)};
  if (o.full) embed.state_bytes = 16 * c.vocab_size * h;
  embed.activation_bytes = o.checkpointing == Checkpointing::kOffload ? 0 : o.tokens * h * act;
  units.push_back(embed);
  // A decoder layer's Linears: {module, in, out}.
  const std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
      {"q_proj", h, c.q_dim()},    {"k_proj", h, c.kv_dim()},   {"v_proj", h, c.kv_dim()}, {"o_proj", c.q_dim(), h},
      {"gate_proj", h, c.intermediate_size}, {"up_proj", h, c.intermediate_size}, {"down_proj", c.intermediate_size, h}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    PlanUnit u{absl::StrCat("model.layers.", i)};
    int64_t norms = 0, biases = 0;  // the norms the family's block has (q/k norms are per head)
    for (const WeightRule& r : c.family->layer_weights)
      if (r.hf.find("norm") != std::string::npos) norms += r.hf.find("_norm") != std::string::npos ? c.head_dim : h;
    if (c.attention_bias) biases += c.q_dim() + 2 * c.kv_dim();
    if (c.o_proj_bias) biases += h;
    if (c.mlp_bias) biases += 2 * c.intermediate_size + h;
    u.weight_bytes = dense(norms + biases);
    const bool moe = c.is_moe_layer(i);
    for (const auto& [name, in, out] : linears) {
      if (moe && (name == "gate_proj" || name == "up_proj" || name == "down_proj")) continue;  // experts below
      u.weight_bytes += o.qlora ? nf4_bytes(in * out) : dense(in * out);
      if (o.full) u.state_bytes += 16 * in * out;
      else if (targeted(o, name)) u.state_bytes += 16 * o.lora_r * (in + out);  // f32 A and B, gradients, AdamW moments
    }
    if (moe) {  // the router (dense) and E experts' gate, up and down (NF4 per expert with QLoRA)
      const int64_t e = c.moe.experts, expert = 3 * h * c.moe.expert_intermediate;
      u.weight_bytes += dense(e * h) + e * (o.qlora ? nf4_bytes(expert) : dense(expert));
      if (o.full) u.state_bytes += 16 * e * (h + expert);
      else if (targeted(o, "experts")) u.state_bytes += 16 * o.lora_r * e * (3 * h + 2 * c.moe.expert_intermediate + h);
    }
    if (o.full) u.state_bytes += 16 * (norms + biases);
    // What backward needs of the layer (train/checkpointing_plan.h's estimate): everything (none), the
    // input (recompute), nothing on the GPU (offload).
    u.activation_bytes = o.checkpointing == Checkpointing::kNone ? layer_activation_bytes(c, i, o.tokens, o.activation_dtype)
                         : o.checkpointing == Checkpointing::kRecompute ? o.tokens * h * act
                                                                        : 0;
    units.push_back(u);
  }
  PlanUnit norm{"model.norm", dense(h)};
  if (o.full) norm.state_bytes = 16 * h;
  units.push_back(norm);
  PlanUnit head{"lm_head", c.tie_word_embeddings ? 0 : dense(c.vocab_size * h)};
  head.tied_to_embedding = c.tie_word_embeddings;
  if (o.full && !c.tie_word_embeddings) head.state_bytes = 16 * c.vocab_size * h;
  units.push_back(head);
  return units;
}

namespace {

// accelerate's device_map JSON: every unit gets the device of the longest key that is it or a
// dotted prefix of it ("" stands for the whole model).
absl::StatusOr<std::vector<Device>> read_map_file(const std::string& path, const std::vector<PlanUnit>& units, int gpus) {
  auto j = read_json_file(path);
  if (!j.ok()) return j.status();
  if (!j->is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": a device map is a JSON object"));
  std::map<std::string, Device> keys;
  for (const auto& [k, v] : j->items()) {
    Device d;
    if (v.is_number_integer() && v.get<int64_t>() >= 0) {
      d = Device::cuda(static_cast<int>(v.get<int64_t>()));
    } else if (v.is_string() && (v == "cpu" || absl::StartsWith(v.get<std::string>(), "cuda"))) {
      auto p = parse_device(v.get<std::string>());
      if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": \"", k, "\": ", p.status().message()));
      d = *p;
    } else if (v.is_string() && v.get<std::string>() == "disk") {
      return absl::UnimplementedError(absl::StrCat(path, ": \"", k, "\": \"disk\": Loom streams layers from host memory, ",
                                                   "not from disk; use \"cpu\""));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", k, "\": ", v.dump(),
                                                     " is not a device (a GPU index, \"cuda:N\" or \"cpu\")"));
    }
    if (d.is_cuda() && d.index >= gpus)
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", k, "\": ", d.str(), " but ", gpus, " GPU(s) are visible"));
    bool used = false;
    for (const PlanUnit& u : units)
      used = used || k.empty() || u.name == k || absl::StartsWith(u.name, k + ".");
    if (!used)
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", k, "\" names no part of the model (its parts: ",
                                                     units.front().name, ", model.layers.0 .. ", units.size() - 3, ", ",
                                                     units[units.size() - 2].name, ", ", units.back().name, ")"));
    keys[k] = d;
  }
  std::vector<Device> out;
  for (const PlanUnit& u : units) {
    const std::string* best = nullptr;
    for (const auto& [k, d] : keys)
      if ((k.empty() || u.name == k || absl::StartsWith(u.name, k + ".")) && (!best || k.size() > best->size())) best = &k;
    if (!best) return absl::InvalidArgumentError(absl::StrCat(path, ": no device for ", u.name));
    out.push_back(keys[*best]);
  }
  return out;
}

}  // namespace

namespace {

// Layers [0, n) on the GPUs in order (each GPU up to its budget), layers [n, L) streamed from the
// host: they run on the GPU that holds the final norm, which also keeps their trainable state and
// activations and two staging slots of the largest. The embedding goes on the first GPU; the final
// norm and lm_head on the last GPU that holds a layer (or the next, if they do not fit beside it).
// False when this n does not fit.
bool fill(const std::vector<PlanUnit>& units, int64_t n, const std::vector<int64_t>& budget, int64_t host_budget,
          std::vector<Device>& chosen, std::vector<int64_t>& used, int64_t& slots) {
  const int gpus = static_cast<int>(budget.size());
  const size_t layers = units.size() - 3;
  chosen.assign(units.size(), Device::cpu());
  used.assign(budget.size(), 0);
  int g = 0;
  used[0] = units[0].bytes();
  chosen[0] = Device::cuda(0);
  if (used[0] > budget[0]) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = units[1 + i].bytes();
    while (g < gpus && used[g] + b > budget[g]) ++g;
    if (g == gpus) return false;
    used[g] += b;
    chosen[1 + i] = Device::cuda(g);
  }
  int64_t streamed_weights = 0, streamed_rest = 0, largest = 0;
  for (size_t i = static_cast<size_t>(n); i < layers; ++i) {
    const PlanUnit& u = units[1 + i];
    streamed_weights += u.weight_bytes;
    streamed_rest += u.state_bytes + u.activation_bytes;
    largest = std::max(largest, u.weight_bytes);
  }
  if (streamed_weights > host_budget) return false;
  slots = n < static_cast<int64_t>(layers) ? 2 * largest : 0;
  const int64_t tail = units[units.size() - 2].bytes() + units.back().bytes() + streamed_rest + slots;
  while (g < gpus && used[g] + tail > budget[g]) ++g;
  if (g == gpus) return false;
  used[g] += tail;
  for (size_t i = static_cast<size_t>(n); i < layers; ++i) chosen[1 + i] = Device::cpu();
  chosen[units.size() - 2] = chosen[units.size() - 1] = Device::cuda(g);
  return true;
}

}  // namespace

absl::StatusOr<DevicePlan> plan_devices(const std::vector<PlanUnit>& units, const std::string& map, const MemoryCaps& caps,
                                        int gpus, const std::map<std::string, int64_t>& available, int64_t working_bytes) {
  LOOM_CHECK(units.size() >= 3, "plan_devices: a model is at least an embedding, a norm and a head");
  DevicePlan plan;
  plan.working_bytes = working_bytes;
  for (const auto& [g, b] : caps.gpu)
    if (g >= gpus) return absl::InvalidArgumentError(absl::StrCat("--max-memory cuda:", g, ": ", gpus, " GPU(s) are visible"));
  auto cap_of = [&](const Device& d) -> int64_t {
    if (d.is_cpu() && caps.cpu) return *caps.cpu;
    if (d.is_cuda() && caps.gpu.count(d.index)) return caps.gpu.at(d.index);
    auto it = available.find(d.str());
    return it == available.end() ? 0 : it->second;
  };
  const size_t layers = units.size() - 3;
  int64_t total = 0, largest = 0;
  for (const PlanUnit& u : units) total += u.bytes(), largest = std::max(largest, u.bytes());
  auto refuse = [&] {
    int64_t weights = 0, state = 0, acts = 0, all_caps = 0;
    for (const PlanUnit& v : units) weights += v.weight_bytes, state += v.state_bytes, acts += v.activation_bytes;
    for (int g = 0; g < gpus; ++g) all_caps += cap_of(Device::cuda(g));
    all_caps += cap_of(Device::cpu());
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model does not fit the devices' memory: it needs ", gib(total), " (weights ", gib(weights),
        ", trainable state ", gib(state), ", kept activations ", gib(acts), ") plus ", gib(working_bytes),
        " of working memory", gpus > 0 ? " a GPU" : "", ", and the caps give ", gib(all_caps), " in all",
        gpus > 0 ? " (the embedding, the final norm, lm_head and the streamed layers' trainable state stay on a GPU)" : "",
        ". Raise --max-memory (cpu=... holds the layers streamed from host memory), or shrink the run: --qlora stores "
        "the weights in 4 bits, --checkpointing offload keeps no activation on the GPU"));
  };
  std::vector<Device> chosen;
  if (map != "auto" && map != "balanced" && map != "sequential") {
    auto from_file = read_map_file(map, units, gpus);
    if (!from_file.ok()) return from_file.status();
    chosen = *from_file;
    plan.strategy = map;
    if (gpus > 0) {  // Loom streams decoder layers; the embedding, final norm and lm_head stay on a GPU
      for (size_t i : {size_t{0}, units.size() - 2, units.size() - 1})
        if (chosen[i].is_cpu())
          return absl::InvalidArgumentError(absl::StrCat(map, ": ", units[i].name, " is mapped to \"cpu\": Loom streams ",
                                                         "decoder layers from host memory, the embedding, the final norm ",
                                                         "and lm_head stay on a GPU"));
      int64_t largest_streamed = 0;  // two staging slots of it
      for (size_t i = 0; i < layers; ++i)
        if (chosen[1 + i].is_cpu()) largest_streamed = std::max(largest_streamed, units[1 + i].weight_bytes);
      plan.stream_slot_bytes = 2 * largest_streamed;
    }
  } else if (gpus == 0) {  // the CPU alone: everything there (it computes: nothing to stream), within its cap
    plan.strategy = "sequential";
    chosen.assign(units.size(), Device::cpu());
    if (total + working_bytes > cap_of(Device::cpu())) return refuse();
  } else {
    plan.strategy = map == "auto" ? (gpus > 1 ? "balanced" : "sequential") : map;
    // Each GPU's budget: its cap less the working memory a GPU needs; balanced cuts it to an even
    // share of the model plus its largest unit.
    std::vector<int64_t> budget;
    for (int g = 0; g < gpus; ++g) {
      int64_t b = cap_of(Device::cuda(g)) - working_bytes;
      if (plan.strategy == "balanced") b = std::min(b, (total + gpus - 1) / gpus + largest);
      budget.push_back(b);
    }
    std::vector<int64_t> used;
    int64_t slots = 0;
    bool fits = false;
    for (int64_t n = static_cast<int64_t>(layers); n >= 0 && !fits; --n)
      fits = fill(units, n, budget, cap_of(Device::cpu()), chosen, used, slots);
    if (!fits) return refuse();
    plan.stream_slot_bytes = slots;
  }
  if (units.back().tied_to_embedding) chosen.back() = chosen.front();  // a tied head is the embedding
  // Bytes where they sit: a streamed layer's weights on the host, the rest of it on the GPU that runs it.
  const Device stream_gpu = chosen[units.size() - 2];
  for (size_t i = 0; i < units.size(); ++i) {
    plan.placement.emplace_back(units[i].name, chosen[i]);
    const bool streamed = gpus > 0 && chosen[i].is_cpu();
    plan.bytes[chosen[i].str()] += streamed ? units[i].weight_bytes : units[i].bytes();
    if (streamed) plan.bytes[stream_gpu.str()] += units[i].state_bytes + units[i].activation_bytes;
  }
  if (plan.stream_slot_bytes > 0) plan.bytes[stream_gpu.str()] += plan.stream_slot_bytes;
  for (auto& [name, b] : plan.bytes)
    if (name != "cpu") b += working_bytes;
  return plan;
}

Placement DevicePlan::to_placement() const {
  const size_t n = placement.size();
  LOOM_CHECK(n >= 3, "DevicePlan::to_placement: an empty plan");
  Placement p;
  p.embed = placement[0].second;
  p.norm = placement[n - 2].second;
  p.head = placement[n - 1].second;
  for (size_t i = 1; i + 2 < n; ++i) {
    const Device d = placement[i].second;
    // On a GPU run a layer mapped to the CPU runs where the final norm does, streamed there.
    const bool streamed = d.is_cpu() && p.norm.is_cuda();
    p.layers.push_back(streamed ? p.norm : d);
    p.streamed.push_back(streamed);
  }
  return p;
}

std::string DevicePlan::describe(const MemoryCaps& caps) const {
  std::map<std::string, std::vector<std::string>> parts;  // device -> its units, layer runs as ranges
  std::map<std::string, std::pair<int64_t, int64_t>> runs;  // device -> the current layer run
  auto flush = [&](const std::string& dev) {
    auto it = runs.find(dev);
    if (it == runs.end()) return;
    const auto [a, b] = it->second;
    parts[dev].push_back(a == b ? absl::StrCat("layer ", a) : absl::StrCat("layers ", a, "-", b));
    runs.erase(it);
  };
  for (const auto& [unit, d] : placement) {
    const std::string dev = d.str();
    int64_t layer = -1;
    if (absl::StartsWith(unit, "model.layers.") && absl::SimpleAtoi(unit.substr(13), &layer)) {
      auto it = runs.find(dev);
      if (it != runs.end() && it->second.second + 1 == layer) {
        it->second.second = layer;
      } else {
        flush(dev);
        runs[dev] = {layer, layer};
      }
      continue;
    }
    flush(dev);
    parts[dev].push_back(unit == "model.embed_tokens" ? "embedding" : unit == "model.norm" ? "final norm" : unit);
  }
  while (!runs.empty()) flush(runs.begin()->first);
  std::string out = absl::StrCat("device map (", strategy, "):\n");
  for (const auto& [dev, list] : parts) {
    std::string cap;
    if (dev == "cpu" && caps.cpu) cap = absl::StrCat(" of ", gib(*caps.cpu));
    int index = 0;
    if (absl::StartsWith(dev, "cuda:") && absl::SimpleAtoi(dev.substr(5), &index) && caps.gpu.count(index))
      cap = absl::StrCat(" of ", gib(caps.gpu.at(index)));
    absl::StrAppend(&out, "  ", dev, ": ", absl::StrJoin(list, ", "), " (", gib(bytes.at(dev)), cap,
                    dev == "cpu" && bytes.size() > 1 ? ", streamed to the GPU a layer ahead" : "", ")\n");
  }
  if (stream_slot_bytes > 0)
    absl::StrAppend(&out, "  the streamed layers run on ", placement[placement.size() - 2].second.str(),
                    ", copied into two staging buffers of ", gib(stream_slot_bytes / 2), "\n");
  return out;
}

nlohmann::json DevicePlan::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [unit, d] : placement) {
    if (d.is_cuda()) j[unit] = d.index;
    else j[unit] = "cpu";
  }
  return j;
}

}  // namespace loom
