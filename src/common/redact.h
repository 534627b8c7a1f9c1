#pragma once
// Secrets out of what is printed and logged. A URL or connection string may carry a password
// (postgresql://user:secret@host/db, ?password=secret, password=secret in libpq's key=value form)
// or a presigned signature; these helpers hide them and keep the rest readable.
// Pure; any thread.

#include <string>
#include <string_view>

namespace minions {

// `text` (a URL or a libpq "key=value ..." string) with the password of its user-info, and the
// values of password / secret / signature / token parameters, replaced by "****".
std::string RedactSecrets(std::string_view text);

}  // namespace minions
