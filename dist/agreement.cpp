// Configuration agreement across ranks (see agreement.h).
#include "dist/agreement.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::dist {

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

// Every rank's `value` (collective), each cut to kShown bytes ("..." marks a cut).
std::vector<std::string> gather_strings(Communicator& comm, const std::string& value) {
  constexpr int64_t kShown = 200;
  const std::string mine = static_cast<int64_t>(value.size()) > kShown ? value.substr(0, kShown - 3) + "..." : value;
  Tensor buf = Tensor::zeros({kShown}, DType::u8);
  std::copy(mine.begin(), mine.end(), buf.data<uint8_t>());
  Tensor all = Tensor::zeros({comm.world_size() * kShown}, DType::u8);
  comm.all_gather(buf, all);
  comm.wait();
  std::vector<std::string> out;
  for (int r = 0; r < comm.world_size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data<uint8_t>() + r * kShown);
    out.emplace_back(p, strnlen(p, kShown));
  }
  return out;
}

}  // namespace

absl::Status check_agreement(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields) {
  const int world = comm.world_size();
  // Entry 0 hashes the field names, so that ranks built from different code are caught too.
  const int64_t n = static_cast<int64_t>(fields.size()) + 1;
  Tensor count = Tensor::zeros({1}, DType::i64);
  *count.data<int64_t>() = n;
  Tensor counts = Tensor::zeros({world}, DType::i64);
  comm.all_gather(count, counts);
  comm.wait();
  for (int r = 0; r < world; ++r)
    if (counts.data<int64_t>()[r] != n)
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, " checks ", counts.data<int64_t>()[r] - 1,
                                                        " configuration fields, this rank ", n - 1,
                                                        ": the ranks run different builds of loom"));
  Tensor mine = Tensor::zeros({n}, DType::i64);
  std::string names;
  for (const auto& [name, value] : fields) names += name + "\n";
  mine.data<int64_t>()[0] = static_cast<int64_t>(fnv1a64(names));
  for (int64_t i = 1; i < n; ++i) mine.data<int64_t>()[i] = static_cast<int64_t>(fnv1a64(fields[i - 1].second));
  Tensor all = Tensor::zeros({world * n}, DType::i64);
  comm.all_gather(mine, all);
  comm.wait();
  const int64_t* h = all.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int> differ;
    for (int r = 1; r < world; ++r)
      if (h[r * n + i] != h[i]) differ.push_back(r);
    if (differ.empty()) continue;
    if (i == 0)
      return absl::FailedPreconditionError("the ranks check different configuration fields: they run different builds of loom");
    // Every rank names every differing rank's value, so that the first rank to exit (mpirun then
    // ends the others, perhaps before they print) has already said everything.
    const std::string& name = fields[i - 1].first;
    const std::vector<std::string> values = gather_strings(comm, fields[i - 1].second);
    std::string who = absl::StrCat("rank 0 has ", name, " = '", values[0], "'");
    constexpr size_t kListed = 7;
    for (size_t k = 0; k < differ.size() && k < kListed; ++k)
      absl::StrAppend(&who, ", rank ", differ[k], " has ", name, " = '", values[differ[k]], "'");
    if (differ.size() > kListed) absl::StrAppend(&who, " and ", differ.size() - kListed, " more ranks differ");
    return absl::FailedPreconditionError(absl::StrCat(
        "the ranks do not agree on the run's configuration: ", name, " differs between rank 0 and rank",
        differ.size() > 1 ? "s " : " ", absl::StrJoin(differ, ", "), " (", who,
        "); start every rank with the same flags and files"));
  }
  return absl::OkStatus();
}

}  // namespace loom::dist
