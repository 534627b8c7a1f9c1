// A configuration file of any content through `minions config check` (without connecting): never
// a crash, every problem a message.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("minions-fuzz-config-" + std::to_string(getpid()) + ".toml")).string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto config = minions::apps::LoadConfig(path);
  if (config.ok()) (void)minions::apps::CheckConfig(*config, /*connect=*/false);
  return 0;
}
