// Training data: JSONL in five shapes ({"text"}, {"prompt","completion"}, and rendered with the
// model's chat template {"messages"} (tool calls too), ShareGPT {"conversations"} and Alpaca
// {"instruction","input","output"}), tokenized with per-token loss masks, then
// packed into fixed-length rows with positions restarting per document and segment ids so
// attention never crosses documents. Shuffled with a seed; each rank reads its own shard; the
// loader's position is part of a checkpoint.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace loom {

// One tokenized document: ids and, per token, whether it is a training target.
struct Example {
  std::vector<int32_t> ids;
  std::vector<uint8_t> target;  // 1 = loss is taken on predicting this token
};

struct DataOptions {
  bool skip_bad_lines = false;
  // For {"messages"}, {"conversations"} and {"instruction"} lines; an error status is reported at
  // the first line that needs it (lines of other shapes never touch it). NotFound, or the ChatML
  // fallback (is_fallback()), gives Alpaca lines the classic Alpaca prompt instead.
  absl::StatusOr<ChatTemplate> chat_template = absl::NotFoundError("no chat template was chosen");
  int64_t max_tokens = 0;  // documents longer are truncated to this (0 = no limit)
  int64_t max_file_bytes = 0;  // a larger data file is refused (0 = default_max_data_bytes())
};
// Half the physical memory: the tokenized documents of a JSONL file are held in memory.
uint64_t default_max_data_bytes();
struct DataStats {
  int64_t lines = 0, examples = 0, skipped = 0, tokens = 0, target_tokens = 0;
  int64_t conversations = 0;  // examples rendered with the chat template
  // With skip_bad_lines: lines skipped because the chat template cannot be used, and the first one's
  // "<file>:<line>: <error naming the template>" (to be said once, not per line).
  int64_t template_skipped = 0;
  std::string template_error;
};
// Reads a JSONL file. A malformed line is an error naming the file and line number, unless
// skip_bad_lines (then it is counted in stats->skipped). An empty dataset is an error, so are a folder,
// a file over max_file_bytes and a line over 64 MiB (ResourceExhausted / InvalidArgument, naming it).
absl::StatusOr<std::vector<Example>> load_jsonl(const std::string& path, const Tokenizer& tokenizer,
                                                const DataOptions& options, DataStats* stats);

// One step's rows on the host: input_ids/labels i32 [batch, seq] (labels -100 where no loss is
// taken and at each document's first token), positions i32 [batch*seq] restarting per document,
// segment_ids i32 [batch, seq]; seq is the batch's width, at most --seq-len (PackedLoader).
struct Batch {
  Tensor input_ids, labels, positions, segment_ids;
  int64_t tokens = 0;         // non-padding tokens
  int64_t target_tokens = 0;  // labels != -100
  // Preference batches (PairLoader): rows [0, pairs) are the chosen sequences, [pairs, 2 pairs) the
  // rejected ones of the same pairs; 0 for packed rows.
  int64_t pairs = 0;
  // Each pair's index in its data file's pairs (what --precompute-ref's scores are looked up by).
  std::vector<int64_t> pair_ids;
  // Where each sequence lies in the flattened [rows * seq] positions: pair i's chosen side at i, its
  // rejected side at pairs + i (train/pair_loader.h).
  std::vector<int64_t> seq_start, seq_len;
  // The rows come in this many equal blocks, block r holding pairs [r P / groups, (r + 1) P / groups)
  // (one per rank).
  int64_t groups = 1;
  // Packed rows (PackedLoader): each row's tokens before its padding, which ends the row (what a
  // mixture-of-experts load-balancing loss counts, as transformers' attention_mask); empty: unknown.
  std::vector<int64_t> row_tokens;
};

// True when every row of the batch is a single piece of one document with no padding (segment ids
// all 0): attention then needs no segment mask, and plain causal attention runs the faster kernels
// (the warp-specialised Hopper ones) with the same result. Rows filled from documents longer than
// seq_len are like that.
bool one_segment_per_row(const Batch& batch);

struct LoaderState {
  int64_t epoch = 0;
  int64_t cursor = 0;  // next example index in this epoch's order (of this rank's shard)
  int64_t offset = 0;  // tokens of that example already emitted (a long document spans rows)
};

// Packs documents greedily into rows of seq_len (a document longer than seq_len is split), in a
// per-epoch shuffled order (seed + epoch), over this rank's shard (documents i with
// i % world == rank). Padding uses pad_id with label -100 and its own segment.
// Details: a document that does not fit in what is left of a row starts the next row, unless it is
// longer than seq_len: then it fills the rest of the row and continues in the following rows. Each
// piece of a split document is its own segment with positions restarting at 0 (and label -100 at its
// first token), since attention cannot see the previous row. Batches never span two epochs: the
// last batch of an epoch is padded (rows of pure padding if needed). A batch is as wide as its
// longest row, rounded up to a multiple of 64 and at most seq_len: one whose rows all end in padding
// (an epoch's last; documents that fill rows only partly) computes no more than it holds. The shuffle is a Fisher-Yates
// driven by splitmix64 of (seed, epoch): the same order on every platform and standard library.
// The epoch's order of n items: a Fisher-Yates shuffle driven by splitmix64 of (seed, epoch), the
// same on every platform (the packer's and the pair loader's).
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

// What the trainer draws its micro-batches from: packed documents (SFT) or preference pairs.
class BatchLoader {
 public:
  virtual ~BatchLoader() = default;
  virtual Batch next() = 0;
  virtual LoaderState state() const = 0;  // part of a checkpoint
  virtual void set_state(const LoaderState& s) = 0;
  // Batches in one pass over the data (epoch 0's order).
  virtual int64_t steps_per_epoch() const = 0;
};

class PackedLoader final : public BatchLoader {
 public:
  PackedLoader(std::vector<Example> examples, int64_t seq_len, int64_t batch_size, uint64_t seed, int rank = 0,
               int world = 1, int32_t pad_id = 0);
  Batch next() override;
  LoaderState state() const override;
  void set_state(const LoaderState& s) override;
  // Batches in one pass over a shard (epoch 0's order), the largest over all ranks so that every
  // rank computes the same number (shards differ in size; a rank that runs out starts its next epoch).
  int64_t steps_per_epoch() const override;

 private:
  std::vector<Example> examples_;  // this rank's shard, empty documents dropped
  int64_t seq_len_, batch_size_;
  uint64_t seed_;
  int32_t pad_id_;
  int64_t steps_per_epoch_ = 0;
  std::vector<int64_t> order_;
  LoaderState state_;
  void reshuffle();
};

}  // namespace loom
