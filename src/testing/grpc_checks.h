#pragma once
// Assertions on a gRPC status, for the tests that drive the services through real stubs: its
// code, and a phrase of its message.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#define EXPECT_GRPC_CODE(status_expr, grpc_code)                                             \
  do {                                                                                       \
    const ::grpc::Status _s = (status_expr);                                                 \
    EXPECT_EQ(_s.error_code(), ::grpc::StatusCode::grpc_code) << _s.error_message();         \
  } while (0)
#define EXPECT_GRPC_ERROR(status_expr, grpc_code, phrase)                                    \
  do {                                                                                       \
    const ::grpc::Status _s = (status_expr);                                                 \
    EXPECT_EQ(_s.error_code(), ::grpc::StatusCode::grpc_code) << _s.error_message();         \
    EXPECT_THAT(_s.error_message(), ::testing::HasSubstr(phrase));                           \
  } while (0)
#define ASSERT_GRPC_OK(status_expr)                                                          \
  do {                                                                                       \
    const ::grpc::Status _s = (status_expr);                                                 \
    ASSERT_TRUE(_s.ok()) << _s.error_code() << ": " << _s.error_message();                   \
  } while (0)
