// A unified diff of two texts, line by line (longest common subsequence),
// with three lines of context: what `primecfg-migrate FILE` prints.
#pragma once

#include <string>
#include <string_view>

namespace primecfg::migrate {

// Empty when the texts are equal. Lines keep their own line endings; a last
// line without one is followed by "\ No newline at end of file".
std::string unified_diff(std::string_view old_name, std::string_view new_name, std::string_view old_text,
                         std::string_view new_text, int context = 3);

}  // namespace primecfg::migrate
