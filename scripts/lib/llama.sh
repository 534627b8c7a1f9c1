# The pinned llama.cpp: where its source comes from and the flags it is built with. Sourced (after
# common.sh) by scripts/setup, which builds the library the runner links, and by
# bench/build-llama-tools, which builds llama-server and llama-batched-bench from the same source
# with the same flags for the benchmarks' baselines.

# The npm package that pins llama.cpp; unpacked once. Also the source of the tokenizers
# (models/ggml-vocab-*.gguf) the test models are made from.
node_llama_cpp_dir() {
  local dir="$MINIONS_CACHE/node-llama-cpp-$NODE_LLAMA_CPP_VERSION"
  if [ ! -f "$dir/.complete" ]; then
    log "fetching llama.cpp as pinned by node-llama-cpp@$NODE_LLAMA_CPP_VERSION"
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null)
    tar -xzf "$dir"/node-llama-cpp-*.tgz -C "$dir" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
    git clone -q "$dir/package/llama/gitRelease.bundle" "$dir/llama.cpp" 2>/dev/null
    rm -f "$dir"/node-llama-cpp-*.tgz
    touch "$dir/.complete"
  fi
  echo "$dir"
}

# CUDA when asked (MINIONS_CUDA=1), or by default when both the toolkit and a GPU are present: a
# toolkit alone (a build machine without a GPU) gets the CPU build, which compiles in minutes.
want_cuda() {
  case "${MINIONS_CUDA:-auto}" in
    1|on|ON) return 0 ;;
    0|off|OFF) return 1 ;;
  esac
  { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } || return 1
  [ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1
}

# Sets LLAMA_VARIANT (cpu, cuda or metal) and LLAMA_FLAGS (the variant's CMake flags).
llama_variant() {
  LLAMA_FLAGS=()
  if [ "$(uname -s)" = Darwin ]; then
    LLAMA_VARIANT=metal
  elif want_cuda; then
    LLAMA_VARIANT=cuda
    LLAMA_FLAGS+=(-DGGML_CUDA=ON)
    [ -x /usr/local/cuda/bin/nvcc ] && LLAMA_FLAGS+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  else
    LLAMA_VARIANT=cpu
    # Without llamafile's sgemm a matrix product gives the same bits whatever the number of
    # sequences in the batch, so a record's output does not depend on what it was batched with
    # (see docs/architecture.md, "Determinism"). Costs some prompt throughput on CPU only.
    LLAMA_FLAGS+=(-DGGML_LLAMAFILE=OFF)
  fi
  # No AMX kernels. -march=native turns them on wherever the CPU reports AMX (Sapphire Rapids and
  # later), and there they crash in ggml_backend_amx_mul_mat on machines that report AMX without
  # granting its tile state (seen on a cloud VM: the test models segfault at their first decode),
  # and compute other bits than the AVX-512 kernels a gang's rpc-servers use. The AVX-512 and
  # AVX2 kernels stay. The flags join the cache stamp, so a copy built with AMX is rebuilt.
  if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
    LLAMA_FLAGS+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  fi
  return 0
}

# The CMake arguments every build of the pinned llama.cpp shares (the library and the tools):
# Release, static, nothing fetched at configure or build time (no TLS library, no prebuilt web UI).
LLAMA_COMMON_CMAKE_ARGS=(
  -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF
)
