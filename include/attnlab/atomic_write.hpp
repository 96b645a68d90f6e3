// Whole-file writes that survive a crash: every file the lab writes goes through here.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace attnlab {

// Writes `parts` (concatenated) as the file `path`: a temp file <path>.tmp.<pid> in the same
// folder, written in full and fsync'ed, renamed over `path`, then the folder fsync'ed, so
// after a crash or power loss `path` is the old file or the new one, whole. Throws IoError
// (attnlab/problem.hpp) naming the file, the step and the errno text ("No space left on
// device", "Read-only file system", ...) when any step fails; the temp file is removed.
void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> parts);
void write_file_atomic(const std::string& path, const std::string& contents);

}  // namespace attnlab
