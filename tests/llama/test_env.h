#pragma once
// Where the llama tests find what the build and ctest prepared: the test models (fixture
// make_test_models), the programs under test and llama.cpp's tokenizers. Paths are compiled in;
// the environment variables override them for runs outside ctest.

#include <cstdlib>
#include <string>

namespace minions::testing {

inline std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}
inline std::string TestModel(const std::string& file) {
  return EnvOr("MINIONS_TEST_MODELS", MINIONS_TEST_MODELS_DIR) + "/" + file;
}
inline std::string TestProgram(const std::string& name) {
  return EnvOr("MINIONS_BIN_DIR", MINIONS_TEST_BIN_DIR) + "/" + name;
}
inline std::string VocabDir() { return EnvOr("MINIONS_VOCAB_DIR", MINIONS_TEST_VOCAB_DIR); }

}  // namespace minions::testing
