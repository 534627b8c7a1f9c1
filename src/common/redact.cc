#include "common/redact.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace minions {
namespace {

constexpr std::string_view kMask = "****";

// Parameter names whose values are secrets (compared case-insensitively, as a suffix, so that
// "X-Amz-Signature", "sslpassword" and "access_token" are covered).
constexpr std::array<std::string_view, 6> kSecretNames = {"password", "secret", "signature", "token",
                                                          "credential", "passfile_contents"};

bool IsSecretName(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (std::string_view secret : kSecretNames) {
    if (lower.size() >= secret.size() && lower.compare(lower.size() - secret.size(), secret.size(), secret) == 0) {
      return true;
    }
  }
  return false;
}

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

}  // namespace

std::string RedactSecrets(std::string_view text) {
  std::string out(text);
  // user:password@ in a URL's authority.
  if (size_t scheme = out.find("://"); scheme != std::string::npos) {
    size_t authority = scheme + 3;
    size_t end = out.find_first_of("/?#", authority);
    if (end == std::string::npos) end = out.size();
    size_t at = out.rfind('@', end);
    if (at != std::string::npos && at >= authority) {
      size_t colon = out.find(':', authority);
      if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, kMask);
    }
  }
  // name=value pairs: a URL's query (separated by & or ;) or libpq's key=value form (by spaces,
  // values optionally single-quoted).
  std::string result;
  result.reserve(out.size());
  size_t i = 0;
  while (i < out.size()) {
    size_t eq = out.find('=', i);
    if (eq == std::string::npos) {
      result.append(out, i, std::string::npos);
      break;
    }
    size_t name_begin = eq;
    while (name_begin > i && IsNameChar(out[name_begin - 1])) --name_begin;
    result.append(out, i, eq + 1 - i);
    size_t value_end = eq + 1;
    if (value_end < out.size() && out[value_end] == '\'') {
      ++value_end;
      while (value_end < out.size() && out[value_end] != '\'') value_end += out[value_end] == '\\' ? 2 : 1;
      value_end = std::min(value_end + 1, out.size());
    } else {
      while (value_end < out.size() && out[value_end] != '&' && out[value_end] != ';' && out[value_end] != ' ' &&
             out[value_end] != '#') {
        ++value_end;
      }
    }
    if (IsSecretName(std::string_view(out).substr(name_begin, eq - name_begin)) && value_end > eq + 1) {
      result.append(kMask);
    } else {
      result.append(out, eq + 1, value_end - eq - 1);
    }
    i = value_end;
  }
  return result;
}

}  // namespace minions
