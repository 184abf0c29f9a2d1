// "Did you mean": the known name a mistyped one most likely meant, for flags, commands and config keys.
#pragma once
#include <string>
#include <vector>

namespace loom {

// The candidate a mistyped `given` most likely meant: the nearest by edit distance (insertions,
// deletions, substitutions and swaps of neighbours, as git and cargo count), when that distance is
// at most max(1, given.size() / 3); "" when none is that close.
std::string closest_match(const std::string& given, const std::vector<std::string>& candidates);

}  // namespace loom
