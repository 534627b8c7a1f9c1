# ctest fixture: makes the test models once per test run. A model whose bytes are those of the
# file already there is not written again, so its time stays that of its first making (the chaos
# suite's reference results are kept while the binaries and the model stay the same).
file(MAKE_DIRECTORY ${OUT})
foreach(kind text embedding)
  execute_process(COMMAND ${MAKER} --kind ${kind} --seed 42 -o ${OUT}/${kind}.gguf.new RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "making the ${kind} test model failed")
  endif()
  file(COPY_FILE ${OUT}/${kind}.gguf.new ${OUT}/${kind}.gguf ONLY_IF_DIFFERENT)
  file(REMOVE ${OUT}/${kind}.gguf.new)
endforeach()
# The text model again with Qwen 2.5's own chat template, which renders tools: tool calling runs
# end to end on it (tests/llama/tool_calls_test.cc). In a folder of its own, so that the suites
# that serve every model of ${OUT} keep seeing the two they know.
file(MAKE_DIRECTORY ${OUT}/tools)
execute_process(COMMAND ${MAKER} --kind text --seed 42 --chat-template qwen2.5-tools -o ${OUT}/tools/text-tools.gguf.new
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "making the text-tools test model failed")
endif()
file(COPY_FILE ${OUT}/tools/text-tools.gguf.new ${OUT}/tools/text-tools.gguf ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}/tools/text-tools.gguf.new)
# The text model beside it, for the suites that serve that folder (tests/integration/openai_sdk_test.cc).
file(COPY_FILE ${OUT}/text.gguf ${OUT}/tools/text.gguf ONLY_IF_DIFFERENT)
