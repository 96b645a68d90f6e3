// Small file helpers for the results folders (every write goes through write_file_atomic).
#pragma once

#include <string>
#include <vector>

namespace attnlab::bench {

// Whole file as text; throws InvalidInput naming the path when it cannot be read.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);
// Creates the folder and its parents; throws IoError (naming the folder and the errno
// text) when that fails: a read-only or full filesystem, a file in the way.
void make_dirs(const std::string& path);
// Regular files in a folder (names only, sorted); empty when the folder is absent.
std::vector<std::string> list_files(const std::string& dir, const std::string& suffix);

// Whether s can label points and configurations (it goes into point ids and file names).
bool is_label(const std::string& s);
inline constexpr const char* kLabelAllowed = "1 to 64 letters, digits, '.', '_' or '-'";

}  // namespace attnlab::bench
