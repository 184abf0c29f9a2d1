// LoraConfig's scales and PEFT's rank_pattern / alpha_pattern lookups (see lora.h).
#include "models/lora.h"

#include <cmath>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

float LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
}

namespace {
// A pattern key of rank_pattern / alpha_pattern as PEFT writes them: module names with "\." for a dot,
// "." for any character and ".*" for any run of them. Other regular-expression syntax is refused when
// the config is read (a backtracking regex engine on a downloaded file's pattern can take forever:
// fuzz_adapter_config found one), so these are matched by a linear wildcard walk instead.
struct PatternToken {
  enum Kind { kChar, kAny, kStar } kind;
  char c = 0;
};

std::optional<std::vector<PatternToken>> tokenize_pattern(const std::string& key) {
  std::vector<PatternToken> out;
  for (size_t i = 0; i < key.size(); ++i) {
    const char ch = key[i];
    if (ch == '\\') {
      if (i + 1 >= key.size() || key[i + 1] != '.') return std::nullopt;
      out.push_back({PatternToken::kChar, '.'});
      ++i;
    } else if (ch == '.') {
      if (i + 1 < key.size() && key[i + 1] == '*') {
        out.push_back({PatternToken::kStar});
        ++i;
      } else {
        out.push_back({PatternToken::kAny});
      }
    } else if (std::string_view("[](){}|+?^$*").find(ch) != std::string_view::npos) {
      return std::nullopt;
    } else {
      out.push_back({PatternToken::kChar, ch});
    }
  }
  return out;
}

// Whole-string match of s against the tokens (the classic wildcard walk: linear with one backtrack point).
bool wildcard_match(std::string_view s, const std::vector<PatternToken>& p) {
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (j < p.size() && p[j].kind != PatternToken::kStar && (p[j].kind == PatternToken::kAny || p[j].c == s[i])) {
      ++i, ++j;
    } else if (j < p.size() && p[j].kind == PatternToken::kStar) {
      star = j++, mark = i;
    } else if (star != std::string::npos) {
      j = star + 1, i = ++mark;
    } else {
      return false;
    }
  }
  while (j < p.size() && p[j].kind == PatternToken::kStar) ++j;
  return j == p.size();
}

// PEFT's get_pattern_key: re.match(rf"(.*\.)?({key})$", name), the first key in order that matches.
template <class V>
const V* pattern_value(const std::vector<std::pair<std::string, V>>& patterns, const std::string& name) {
  for (const auto& [key, v] : patterns) {
    const auto tokens = tokenize_pattern(key);
    if (!tokens) continue;  // refused when read; not reached
    for (size_t start = 0; start <= name.size(); start = name.find('.', start) + 1) {
      if (wildcard_match(std::string_view(name).substr(start), *tokens)) return &v;
      if (name.find('.', start) == std::string::npos) break;
    }
  }
  return nullptr;
}
}  // namespace

bool LoraConfig::pattern_supported(const std::string& key) { return tokenize_pattern(key).has_value(); }

int64_t LoraConfig::rank_for(const std::string& name) const {
  const int64_t* v = pattern_value(rank_pattern, name);
  return v ? *v : r;
}

float LoraConfig::scale_for(const std::string& name) const {
  const float* a = pattern_value(alpha_pattern, name);
  const float rank = static_cast<float>(rank_for(name)), al = a ? *a : alpha;
  return use_rslora ? al / std::sqrt(rank) : al / rank;
}

}  // namespace loom
