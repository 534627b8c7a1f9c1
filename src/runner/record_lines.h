#pragma once
// NonBlankLines: the one splitter of newline-delimited records and answers (a task's input, a
// chunk object), for the runner and the server's chunk checks alike.

#include <string_view>
#include <vector>

namespace minions {

// The lines of `data` that are not blank (IsBlankLine), as views into it.
std::vector<std::string_view> NonBlankLines(std::string_view data);

}  // namespace minions
