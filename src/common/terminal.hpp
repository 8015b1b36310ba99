// Text for terminals and scripts: bytes that came from files or the command line, made safe to print.
#pragma once

#include <string>
#include <string_view>

namespace gdskit {

/// `text` with control characters (below 0x20 and 0x7f) written as \xNN, so that a file name or a
/// job-file line cannot move the cursor, change colours or end a line in a report. Other bytes are kept.
std::string printable(std::string_view text);

}  // namespace gdskit
