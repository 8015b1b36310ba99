// fmt's compiled part, built once here for the whole tree. With fmt used header-only, every file that formats
// compiled fmt's formatting engine again (seconds of CPU per file); now files see its declarations only and
// link these definitions. The explicit instances are the ones fmt/format.h declares extern, and the locale
// accessors its {:L} formatting refers to.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;

}  // namespace detail
FMT_END_NAMESPACE
