// See closest_match.h.
#include "text/closest_match.h"

#include <algorithm>

namespace loom {

std::string closest_match(const std::string& given, const std::vector<std::string>& candidates) {
  // Optimal string alignment distance: Levenshtein plus the swap of two neighbours ("--modle").
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    return d[a.size()][b.size()];
  };
  const size_t limit = std::max<size_t>(1, given.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates)
    if (const size_t d = distance(given, c); d < best_d) {
      best_d = d;
      best = c;
    }
  return best;
}

}  // namespace loom
