#pragma once
// RETURN_IF_ERROR / ASSIGN_OR_RETURN: propagate absl::Status across module boundaries without
// exceptions (see docs/architecture.md, "Errors").

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MINIONS_STATUS_CONCAT_INNER(a, b) a##b
#define MINIONS_STATUS_CONCAT(a, b) MINIONS_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::absl::Status _minions_status = (expr);  \
    if (!_minions_status.ok()) return _minions_status; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  MINIONS_ASSIGN_OR_RETURN_IMPL(MINIONS_STATUS_CONCAT(_minions_statusor_, __LINE__), lhs, expr)

#define MINIONS_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
