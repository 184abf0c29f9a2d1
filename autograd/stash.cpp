// Stash (autograd/stash.h).
#include "autograd/stash.h"

namespace loom::ag {

namespace {
thread_local detail::Stash* t_stash = nullptr;
thread_local bool t_replay = false;
thread_local int64_t t_stash_hits = 0;
}  // namespace

int64_t stash_hits() { return t_stash_hits; }

namespace detail {

void Stash::put(const std::vector<Tensor>& values) {
  if (!room_) return;
  StashRoom& room = *room_;
  int64_t bytes = 0;  // pinned bytes the entry takes (CPU tensors are kept where they are)
  for (const Tensor& v : values)
    if (v.is_cuda()) bytes += static_cast<int64_t>(v.nbytes());
  std::vector<std::shared_ptr<OffloadedTensor>> entry;
  const bool fits = bytes == 0 || room.fetch_sub(bytes) >= bytes;  // taken from the room when it fits
  if (fits) {
    for (const Tensor& v : values) {
      std::shared_ptr<OffloadedTensor> o = OffloadedTensor::offload_or_drop(v);
      if (!o) {  // the budget is spent after all: dropped whole (what was copied goes back to the cache)
        entry.clear();
        break;
      }
      entry.push_back(std::move(o));
    }
  }
  if (bytes > 0 && entry.empty()) room.fetch_add(bytes);  // given back (also what a misfit took)
  entries_.push_back(std::move(entry));
}

std::optional<std::vector<Tensor>> Stash::take() {
  if (next_ >= entries_.size()) return std::nullopt;
  std::vector<std::shared_ptr<OffloadedTensor>> entry = std::move(entries_[next_++]);
  if (entry.empty()) return std::nullopt;
  std::vector<Tensor> values;
  for (auto& o : entry) values.push_back(o->fetch());
  ++t_stash_hits;
  return values;
}

void Stash::prefetch() {
  for (size_t i = next_; i < entries_.size(); ++i)
    for (auto& o : entries_[i]) o->prefetch();
}

StashScope::StashScope(Stash* stash, bool replay) : previous_(t_stash), previous_replay_(t_replay) {
  t_stash = stash;
  t_replay = replay;
}
StashScope::~StashScope() {
  t_stash = previous_;
  t_replay = previous_replay_;
}
Stash* StashScope::writing() { return t_stash && !t_replay ? t_stash : nullptr; }
Stash* StashScope::reading() { return t_stash && t_replay ? t_stash : nullptr; }

}  // namespace detail
}  // namespace loom::ag
