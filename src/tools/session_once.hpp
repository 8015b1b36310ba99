// Things a command says once per terminal session rather than on every run (the patch's note on what it does
// not prove): a marker file per session, under $XDG_RUNTIME_DIR/gdskit (emptied at logout), else under the cache
// folder ($XDG_CACHE_HOME/gdskit/sessions or ~/.cache/gdskit/sessions, where markers of earlier boots are removed).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace gdskit::tools {

/// This terminal session: the boot, the session id (getsid: the login shell of a terminal, or setsid's child)
/// and the session leader's start time (so a reused id is another session). Stable across the commands of one
/// session; never empty.
std::string session_key();

/// The folder session markers go in (see above); empty when neither XDG_RUNTIME_DIR, XDG_CACHE_HOME nor HOME is
/// usable.
std::filesystem::path session_marker_dir();

/// True the first time `what` (a short name: "patch-note") is asked about in this session, false afterwards.
/// True also when no marker can be kept (better said twice than never). Never throws.
bool first_in_session(std::string_view what) noexcept;

}  // namespace gdskit::tools
